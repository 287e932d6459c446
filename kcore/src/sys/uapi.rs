//! Linux's user-visible structures, in the exact layout of each ABI.
//!
//! Each structure is a `#[repr(C)]` Rust struct with Linux's field names;
//! the i386 ones are `packed(4)` because the i386 ABI aligns 64-bit
//! integers to 4 bytes. `to_bytes`/`from_bytes` place each field at its
//! `offset_of!`, little-endian, so the bytes a program sees are exactly the
//! struct layout, which the tests pin to Linux's sizes and offsets.

/// A field of a user structure: an integer or an array of them.
pub trait Field: Sized + Copy {
    /// Writes the value little-endian at the start of `out`.
    fn put(self, out: &mut [u8]);
    /// Reads the value from the start of `b`.
    fn get(b: &[u8]) -> Self;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn put(self, out: &mut [u8]) {
                out[..core::mem::size_of::<$t>()].copy_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..core::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i16, i32, i64);

impl<T: Field, const N: usize> Field for [T; N] {
    fn put(self, out: &mut [u8]) {
        let w = core::mem::size_of::<T>();
        for (i, v) in self.into_iter().enumerate() {
            v.put(&mut out[i * w..]);
        }
    }
    fn get(b: &[u8]) -> Self {
        let w = core::mem::size_of::<T>();
        core::array::from_fn(|i| T::get(&b[i * w..]))
    }
}

macro_rules! user_struct {
    ($(#[$m:meta])* $(@packed $p:literal)? pub struct $name:ident {
        $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)?
    }) => {
        $(#[$m])*
        #[repr(C $(, packed($p))?)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(missing_docs)] // The fields are Linux's, with Linux's names.
        pub struct $name { $($(#[$fm])* pub $f: $t),* }

        impl $name {
            /// Size in bytes, as in the ABI.
            pub const SIZE: usize = core::mem::size_of::<$name>();

            /// The bytes a program sees.
            pub fn to_bytes(&self) -> [u8; core::mem::size_of::<$name>()] {
                let mut b = [0u8; core::mem::size_of::<$name>()];
                $( Field::put({ self.$f }, &mut b[core::mem::offset_of!($name, $f)..]); )*
                b
            }

            /// Decodes the bytes a program passed.
            pub fn from_bytes(b: &[u8; core::mem::size_of::<$name>()]) -> $name {
                $name { $( $f: Field::get(&b[core::mem::offset_of!($name, $f)..]), )* }
            }
        }
    };
}

user_struct! {
    /// x86_64 `struct stat` (stat, fstat, lstat, newfstatat).
    pub struct Stat {
        pub st_dev: u64, pub st_ino: u64, pub st_nlink: u64,
        pub st_mode: u32, pub st_uid: u32, pub st_gid: u32, pub pad0: u32,
        pub st_rdev: u64, pub st_size: i64, pub st_blksize: i64, pub st_blocks: i64,
        pub st_atime: i64, pub st_atime_nsec: i64,
        pub st_mtime: i64, pub st_mtime_nsec: i64,
        pub st_ctime: i64, pub st_ctime_nsec: i64,
        pub unused: [i64; 3],
    }
}

user_struct! {
    /// i386 `struct stat64` (stat64, lstat64, fstat64, fstatat64).
    @packed 4
    pub struct Stat64 {
        pub st_dev: u64, pub pad0: [u8; 4], pub st_ino32: u32,
        pub st_mode: u32, pub st_nlink: u32, pub st_uid: u32, pub st_gid: u32,
        pub st_rdev: u64, pub pad3: [u8; 4], pub st_size: i64, pub st_blksize: u32,
        pub st_blocks: u64,
        pub st_atime: u32, pub st_atime_nsec: u32,
        pub st_mtime: u32, pub st_mtime_nsec: u32,
        pub st_ctime: u32, pub st_ctime_nsec: u32,
        pub st_ino: u64,
    }
}

user_struct! {
    /// i386 `struct stat` (the i386 stat, lstat, fstat: numbers 106-108).
    pub struct Stat32 {
        pub st_dev: u32, pub st_ino: u32, pub st_mode: u16, pub st_nlink: u16,
        pub st_uid: u16, pub st_gid: u16, pub st_rdev: u32, pub st_size: u32,
        pub st_blksize: u32, pub st_blocks: u32,
        pub st_atime: u32, pub st_atime_nsec: u32,
        pub st_mtime: u32, pub st_mtime_nsec: u32,
        pub st_ctime: u32, pub st_ctime_nsec: u32,
        pub unused4: u32, pub unused5: u32,
    }
}

user_struct! {
    /// `struct statx` (same in both ABIs).
    pub struct Statx {
        pub stx_mask: u32, pub stx_blksize: u32, pub stx_attributes: u64,
        pub stx_nlink: u32, pub stx_uid: u32, pub stx_gid: u32, pub stx_mode: u16,
        pub spare0: u16, pub stx_ino: u64, pub stx_size: u64, pub stx_blocks: u64,
        pub stx_attributes_mask: u64,
        pub stx_atime_sec: i64, pub stx_atime_nsec: u32, pub stx_atime_res: i32,
        pub stx_btime_sec: i64, pub stx_btime_nsec: u32, pub stx_btime_res: i32,
        pub stx_ctime_sec: i64, pub stx_ctime_nsec: u32, pub stx_ctime_res: i32,
        pub stx_mtime_sec: i64, pub stx_mtime_nsec: u32, pub stx_mtime_res: i32,
        pub stx_rdev_major: u32, pub stx_rdev_minor: u32,
        pub stx_dev_major: u32, pub stx_dev_minor: u32,
        pub stx_mnt_id: u64, pub stx_dio_mem_align: u32, pub stx_dio_offset_align: u32,
        pub spare3: [u64; 12],
    }
}

user_struct! {
    /// 64-bit `struct timespec` (x86_64, and i386 `*_time64` calls).
    pub struct Timespec64 { pub tv_sec: i64, pub tv_nsec: i64 }
}

user_struct! {
    /// i386 `struct old_timespec32`.
    pub struct Timespec32 { pub tv_sec: i32, pub tv_nsec: i32 }
}

user_struct! {
    /// x86_64 `struct timeval`.
    pub struct Timeval64 { pub tv_sec: i64, pub tv_usec: i64 }
}

user_struct! {
    /// i386 `struct old_timeval32`.
    pub struct Timeval32 { pub tv_sec: i32, pub tv_usec: i32 }
}

user_struct! {
    /// x86_64 kernel `struct sigaction` (rt_sigaction).
    pub struct Sigaction64 { pub sa_handler: u64, pub sa_flags: u64, pub sa_restorer: u64, pub sa_mask: u64 }
}

user_struct! {
    /// i386 `struct compat_sigaction` (rt_sigaction of an i386 process).
    @packed 4
    pub struct Sigaction32 { pub sa_handler: u32, pub sa_flags: u32, pub sa_restorer: u32, pub sa_mask: u64 }
}

user_struct! {
    /// i386 `struct user_desc` (set_thread_area, get_thread_area).
    pub struct UserDesc { pub entry_number: u32, pub base_addr: u32, pub limit: u32, pub flags: u32 }
}

user_struct! {
    /// `struct new_utsname` (uname).
    pub struct Utsname {
        pub sysname: [u8; 65], pub nodename: [u8; 65], pub release: [u8; 65],
        pub version: [u8; 65], pub machine: [u8; 65], pub domainname: [u8; 65],
    }
}

user_struct! {
    /// `struct rlimit64` (prlimit64; x86_64 getrlimit/setrlimit).
    pub struct Rlimit64 { pub rlim_cur: u64, pub rlim_max: u64 }
}

user_struct! {
    /// i386 `struct compat_rlimit` (getrlimit, ugetrlimit, setrlimit).
    pub struct Rlimit32 { pub rlim_cur: u32, pub rlim_max: u32 }
}

user_struct! {
    /// x86_64 `struct iovec`.
    pub struct Iovec64 { pub iov_base: u64, pub iov_len: u64 }
}

user_struct! {
    /// i386 `struct compat_iovec`.
    pub struct Iovec32 { pub iov_base: u32, pub iov_len: u32 }
}

user_struct! {
    /// x86_64 `stack_t` (sigaltstack).
    pub struct Stack64 { pub ss_sp: u64, pub ss_flags: i32, pub pad: u32, pub ss_size: u64 }
}

user_struct! {
    /// i386 `compat_stack_t`.
    pub struct Stack32 { pub ss_sp: u32, pub ss_flags: i32, pub ss_size: u32 }
}

user_struct! {
    /// `struct pollfd` (both ABIs).
    pub struct Pollfd { pub fd: i32, pub events: i16, pub revents: i16 }
}

user_struct! {
    /// x86_64 `struct sysinfo`.
    pub struct Sysinfo64 {
        pub uptime: i64, pub loads: [u64; 3], pub totalram: u64, pub freeram: u64,
        pub sharedram: u64, pub bufferram: u64, pub totalswap: u64, pub freeswap: u64,
        pub procs: u16, pub pad: u16, pub pad2: u32, pub totalhigh: u64, pub freehigh: u64,
        pub mem_unit: u32, pub pad3: u32,
    }
}

user_struct! {
    /// i386 `struct compat_sysinfo`.
    pub struct Sysinfo32 {
        pub uptime: i32, pub loads: [u32; 3], pub totalram: u32, pub freeram: u32,
        pub sharedram: u32, pub bufferram: u32, pub totalswap: u32, pub freeswap: u32,
        pub procs: u16, pub pad: u16, pub totalhigh: u32, pub freehigh: u32,
        pub mem_unit: u32, pub f: [u8; 8],
    }
}

user_struct! {
    /// x86_64 `struct rusage`.
    pub struct Rusage64 {
        pub utime_sec: i64, pub utime_usec: i64, pub stime_sec: i64, pub stime_usec: i64,
        pub rest: [i64; 14],
    }
}

user_struct! {
    /// i386 `struct compat_rusage`.
    pub struct Rusage32 {
        pub utime_sec: i32, pub utime_usec: i32, pub stime_sec: i32, pub stime_usec: i32,
        pub rest: [i32; 14],
    }
}

user_struct! {
    /// The i386 old `mmap` (number 90) argument block `struct mmap_arg_struct`.
    pub struct MmapArgs32 { pub addr: u32, pub len: u32, pub prot: u32, pub flags: u32, pub fd: u32, pub offset: u32 }
}

/// Builds a NUL-padded `[u8; 65]` utsname field.
pub fn uts_field(s: &[u8]) -> [u8; 65] {
    let mut f = [0u8; 65];
    let n = s.len().min(64);
    f[..n].copy_from_slice(&s[..n]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn x86_64_stat_layout() {
        assert_eq!(Stat::SIZE, 144);
        assert_eq!(offset_of!(Stat, st_nlink), 16);
        assert_eq!(offset_of!(Stat, st_mode), 24);
        assert_eq!(offset_of!(Stat, st_uid), 28);
        assert_eq!(offset_of!(Stat, st_rdev), 40);
        assert_eq!(offset_of!(Stat, st_size), 48);
        assert_eq!(offset_of!(Stat, st_blksize), 56);
        assert_eq!(offset_of!(Stat, st_blocks), 64);
        assert_eq!(offset_of!(Stat, st_atime), 72);
        assert_eq!(offset_of!(Stat, st_mtime), 88);
        assert_eq!(offset_of!(Stat, st_ctime_nsec), 112);
    }

    #[test]
    fn i386_stat64_and_stat_layouts() {
        assert_eq!(Stat64::SIZE, 96);
        assert_eq!(offset_of!(Stat64, st_ino32), 12);
        assert_eq!(offset_of!(Stat64, st_mode), 16);
        assert_eq!(offset_of!(Stat64, st_uid), 24);
        assert_eq!(offset_of!(Stat64, st_rdev), 32);
        assert_eq!(offset_of!(Stat64, st_size), 44);
        assert_eq!(offset_of!(Stat64, st_blksize), 52);
        assert_eq!(offset_of!(Stat64, st_blocks), 56);
        assert_eq!(offset_of!(Stat64, st_atime), 64);
        assert_eq!(offset_of!(Stat64, st_mtime), 72);
        assert_eq!(offset_of!(Stat64, st_ino), 88);
        assert_eq!(Stat32::SIZE, 64);
        assert_eq!(offset_of!(Stat32, st_mode), 8);
        assert_eq!(offset_of!(Stat32, st_size), 20);
        assert_eq!(offset_of!(Stat32, st_mtime), 40);
    }

    #[test]
    fn statx_layout() {
        assert_eq!(Statx::SIZE, 256);
        assert_eq!(offset_of!(Statx, stx_mode), 28);
        assert_eq!(offset_of!(Statx, stx_ino), 32);
        assert_eq!(offset_of!(Statx, stx_size), 40);
        assert_eq!(offset_of!(Statx, stx_atime_sec), 64);
        assert_eq!(offset_of!(Statx, stx_btime_sec), 80);
        assert_eq!(offset_of!(Statx, stx_ctime_sec), 96);
        assert_eq!(offset_of!(Statx, stx_mtime_sec), 112);
        assert_eq!(offset_of!(Statx, stx_rdev_major), 128);
        assert_eq!(offset_of!(Statx, stx_dev_major), 136);
        assert_eq!(offset_of!(Statx, stx_mnt_id), 144);
    }

    #[test]
    fn time_signal_and_small_layouts() {
        assert_eq!(Timespec64::SIZE, 16);
        assert_eq!(offset_of!(Timespec64, tv_nsec), 8);
        assert_eq!(Timespec32::SIZE, 8);
        assert_eq!(offset_of!(Timespec32, tv_nsec), 4);
        assert_eq!(Timeval64::SIZE, 16);
        assert_eq!(Timeval32::SIZE, 8);
        assert_eq!(Sigaction64::SIZE, 32);
        assert_eq!(offset_of!(Sigaction64, sa_flags), 8);
        assert_eq!(offset_of!(Sigaction64, sa_restorer), 16);
        assert_eq!(offset_of!(Sigaction64, sa_mask), 24);
        assert_eq!(Sigaction32::SIZE, 20);
        assert_eq!(offset_of!(Sigaction32, sa_flags), 4);
        assert_eq!(offset_of!(Sigaction32, sa_restorer), 8);
        assert_eq!(offset_of!(Sigaction32, sa_mask), 12);
        assert_eq!(UserDesc::SIZE, 16);
        assert_eq!(offset_of!(UserDesc, flags), 12);
        assert_eq!(Utsname::SIZE, 390);
        assert_eq!(offset_of!(Utsname, release), 130);
        assert_eq!(offset_of!(Utsname, machine), 260);
        assert_eq!(Rlimit64::SIZE, 16);
        assert_eq!(Rlimit32::SIZE, 8);
        assert_eq!(Iovec64::SIZE, 16);
        assert_eq!(offset_of!(Iovec64, iov_len), 8);
        assert_eq!(Iovec32::SIZE, 8);
        assert_eq!(offset_of!(Iovec32, iov_len), 4);
        assert_eq!(Stack64::SIZE, 24);
        assert_eq!(offset_of!(Stack64, ss_size), 16);
        assert_eq!(Stack32::SIZE, 12);
        assert_eq!(Pollfd::SIZE, 8);
        assert_eq!(Sysinfo64::SIZE, 112);
        assert_eq!(offset_of!(Sysinfo64, procs), 80);
        assert_eq!(offset_of!(Sysinfo64, totalhigh), 88);
        assert_eq!(offset_of!(Sysinfo64, mem_unit), 104);
        assert_eq!(Sysinfo32::SIZE, 64);
        assert_eq!(offset_of!(Sysinfo32, procs), 40);
        assert_eq!(offset_of!(Sysinfo32, mem_unit), 52);
        assert_eq!(Rusage64::SIZE, 144);
        assert_eq!(Rusage32::SIZE, 72);
        assert_eq!(MmapArgs32::SIZE, 24);
    }

    #[test]
    fn encoding_is_little_endian_at_the_field_offsets() {
        let s = Sigaction32 {
            sa_handler: 0x1122_3344,
            sa_flags: 0x0400_0000,
            sa_restorer: 0xdead_beef,
            sa_mask: 0x0102_0304_0506_0708,
        };
        let b = s.to_bytes();
        assert_eq!(&b[..4], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[12..20], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(Sigaction32::from_bytes(&b), s);
        let t = Timespec64 {
            tv_sec: -1,
            tv_nsec: 5,
        };
        assert_eq!(Timespec64::from_bytes(&t.to_bytes()), t);
    }
}
