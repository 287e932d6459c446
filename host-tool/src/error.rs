//! The errors `perch` reports and the exit code each one maps to.

use thiserror::Error;

use crate::convert::ConvertError;
use crate::image::ImageError;

/// Exit codes (documented in `perch --help`).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// I/O or other runtime failure.
    pub const FAILURE: i32 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: i32 = 2;
    /// The input is not a usable Perch stream (garbage, wrong protocol version, no Hello).
    pub const BAD_STREAM: i32 = 3;
    /// The image is unreadable or does not match the stream.
    pub const BAD_IMAGE: i32 = 4;
    /// A required external tool (QEMU, perf) is missing or does not work.
    pub const MISSING_TOOL: i32 = 5;
    /// The appliance failed or crashed.
    pub const APPLIANCE_FAILED: i32 = 6;
    /// The stream stopped before its End record: output written from what arrived.
    pub const TRUNCATED: i32 = 7;
    /// A program, a data file or the appliance manifest is unusable (not a
    /// static x86-64 / i386 ELF, missing, unreadable, an unknown key):
    /// nothing was booted.
    pub const BAD_PROGRAM: i32 = 8;
    /// The run completed and perf.data was written, but a program was
    /// killed by a signal (a crash).
    pub const PROGRAM_CRASHED: i32 = 9;
}

/// Everything that can stop `perch`.
#[derive(Debug, Error)]
pub enum HostError {
    /// File or device I/O.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The image.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// No runtime image to boot: not given, not in `$PERCH_IMAGE`, not
    /// shipped with perch (the message names every place looked).
    #[error("{0}")]
    NoImage(String),
    /// Conversion.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// Not a Perch stream at all.
    #[error("{0}")]
    NotPerch(String),
    /// A stream of another protocol version.
    #[error("{0}; use the perch built from the same source as the appliance")]
    Protocol(String),
    /// A tool perch runs is missing.
    #[error("{tool} not found ({reason}); install it with `{install}`")]
    MissingTool {
        /// The program.
        tool: String,
        /// Why it was not usable.
        reason: String,
        /// The install command.
        install: String,
    },
    /// A tool perch runs is there but does not work (`--qemu /bin/false`).
    #[error("{0}")]
    BadTool(String),
    /// The appliance (QEMU) ended badly.
    #[error("{0}")]
    Appliance(String),
    /// The serial device.
    #[error("serial device {device}: {source}")]
    Serial {
        /// The device path.
        device: String,
        /// The cause.
        source: serialport::Error,
    },
    /// Flamegraph rendering.
    #[error("flamegraph: {0}")]
    Flamegraph(String),
    /// A stream with no samples where samples are needed (a flamegraph).
    #[error("{0}")]
    NoSamples(String),
    /// Bad argument combination or value.
    #[error("{0}")]
    Usage(String),
    /// The programs of the run are unusable.
    #[error(transparent)]
    Spec(#[from] crate::manifest::SpecError),
    /// The boot archive could not be packed.
    #[error("packing the boot archive: {0}")]
    Pack(#[from] crate::archive::PackError),
}

impl HostError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        HostError::Io {
            context: context.into(),
            source,
        }
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            HostError::Io { .. } | HostError::Serial { .. } | HostError::Flamegraph(_) => {
                exit::FAILURE
            }
            HostError::Image(_) | HostError::NoImage(_) => exit::BAD_IMAGE,
            HostError::Convert(ConvertError::WrongImage { .. }) => exit::BAD_IMAGE,
            HostError::Convert(ConvertError::Write(_)) => exit::FAILURE,
            HostError::Convert(_)
            | HostError::NotPerch(_)
            | HostError::Protocol(_)
            | HostError::NoSamples(_) => exit::BAD_STREAM,
            HostError::MissingTool { .. } | HostError::BadTool(_) => exit::MISSING_TOOL,
            HostError::Appliance(_) => exit::APPLIANCE_FAILED,
            HostError::Usage(_) => exit::USAGE,
            HostError::Spec(_) | HostError::Pack(_) => exit::BAD_PROGRAM,
        }
    }
}
