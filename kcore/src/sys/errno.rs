//! Linux error numbers, as one typed enum.
//!
//! Handlers return `Result<u64, Errno>`; the dispatcher turns an `Err` into
//! the value Linux puts in `rax`/`eax`: the negated number.

/// A Linux error number (`asm-generic/errno-base.h` and `errno.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u16)]
#[allow(missing_docs)] // The names are Linux's; each variant's doc is its strerror text.
pub enum Errno {
    /// Operation not permitted.
    EPERM = 1,
    /// No such file or directory.
    ENOENT = 2,
    /// No such process.
    ESRCH = 3,
    /// Interrupted system call.
    EINTR = 4,
    /// I/O error.
    EIO = 5,
    /// No such device or address.
    ENXIO = 6,
    /// Argument list too long.
    E2BIG = 7,
    /// Exec format error.
    ENOEXEC = 8,
    /// Bad file descriptor.
    EBADF = 9,
    /// No child processes.
    ECHILD = 10,
    /// Resource temporarily unavailable (also EWOULDBLOCK).
    EAGAIN = 11,
    /// Cannot allocate memory.
    ENOMEM = 12,
    /// Permission denied.
    EACCES = 13,
    /// Bad address.
    EFAULT = 14,
    /// Device or resource busy.
    EBUSY = 16,
    /// File exists.
    EEXIST = 17,
    /// Invalid cross-device link.
    EXDEV = 18,
    /// No such device.
    ENODEV = 19,
    /// Not a directory.
    ENOTDIR = 20,
    /// Is a directory.
    EISDIR = 21,
    /// Invalid argument.
    EINVAL = 22,
    /// Too many open files in system.
    ENFILE = 23,
    /// Too many open files.
    EMFILE = 24,
    /// Inappropriate ioctl for device.
    ENOTTY = 25,
    /// File too large.
    EFBIG = 27,
    /// No space left on device.
    ENOSPC = 28,
    /// Illegal seek.
    ESPIPE = 29,
    /// Read-only file system.
    EROFS = 30,
    /// Too many links.
    EMLINK = 31,
    /// Broken pipe.
    EPIPE = 32,
    /// Numerical result out of range.
    /// Numerical argument out of domain.
    EDOM = 33,
    ERANGE = 34,
    /// File name too long.
    ENAMETOOLONG = 36,
    /// Function not implemented.
    ENOSYS = 38,
    /// Directory not empty.
    ENOTEMPTY = 39,
    /// Too many levels of symbolic links.
    ELOOP = 40,
    /// Value too large for defined data type.
    EOVERFLOW = 75,
    /// No buffer space available.
    ENOBUFS = 105,
    /// Socket operation on non-socket.
    ENOTSOCK = 88,
    /// Destination address required.
    EDESTADDRREQ = 89,
    /// Message too long.
    EMSGSIZE = 90,
    /// Protocol wrong type for socket.
    EPROTOTYPE = 91,
    /// Protocol not available.
    ENOPROTOOPT = 92,
    /// Protocol not supported.
    EPROTONOSUPPORT = 93,
    /// Socket type not supported.
    ESOCKTNOSUPPORT = 94,
    /// Operation not supported.
    EOPNOTSUPP = 95,
    /// Address family not supported by protocol.
    EAFNOSUPPORT = 97,
    /// Address already in use.
    EADDRINUSE = 98,
    /// Cannot assign requested address.
    EADDRNOTAVAIL = 99,
    /// Network is unreachable.
    ENETUNREACH = 101,
    /// Software caused connection abort.
    ECONNABORTED = 103,
    /// Connection reset by peer.
    ECONNRESET = 104,
    /// Transport endpoint is already connected.
    EISCONN = 106,
    /// Transport endpoint is not connected.
    ENOTCONN = 107,
    /// Connection timed out (futex waits that time out).
    ETIMEDOUT = 110,
    /// Connection refused.
    ECONNREFUSED = 111,
    /// Operation already in progress.
    EALREADY = 114,
    /// Operation now in progress.
    EINPROGRESS = 115,
}

impl Errno {
    /// Linux's number for this error.
    pub const fn number(self) -> u16 {
        self as u16
    }

    /// The 64-bit register value Linux returns for this error: `-errno`.
    /// For i386 processes the runtime stores the low 32 bits in `eax`,
    /// which is the same `-errno` in 32 bits.
    pub const fn to_return(self) -> u64 {
        (-(self as i64)) as u64
    }
}

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{self:?} ({})", self.number())
    }
}

/// The result of a system-call handler: the success value or an error.
pub type SysResult = Result<u64, Errno>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_linux_numbers() {
        assert_eq!(Errno::EPERM.number(), 1);
        assert_eq!(Errno::EBADF.number(), 9);
        assert_eq!(Errno::EFAULT.number(), 14);
        assert_eq!(Errno::EINVAL.number(), 22);
        assert_eq!(Errno::ENOTTY.number(), 25);
        assert_eq!(Errno::EROFS.number(), 30);
        assert_eq!(Errno::ENAMETOOLONG.number(), 36);
        assert_eq!(Errno::ENOSYS.number(), 38);
        assert_eq!(Errno::ETIMEDOUT.number(), 110);
        assert_eq!(Errno::ENOSYS.to_return(), (-38i64) as u64);
        assert_eq!(Errno::EFAULT.to_return() as u32, (-14i32) as u32);
    }
}
