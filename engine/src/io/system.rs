//! The backend for real files: io_uring on Linux where it can be set up, pread/pwrite otherwise
//! or when asked.

use super::{
    Completion, DirectoryEntry, FileHandle, Io, Linked, Namespace, OpenMode, Operation, PreadIo,
};
use std::io;
use std::path::Path;
use std::str::FromStr;

/// Which backend [`SystemIo::new`] sets up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// io_uring where the kernel allows it, pread/pwrite otherwise.
    #[default]
    Auto,
    /// io_uring, or an error where it is unavailable.
    IoUring,
    /// Positional reads and writes on the calling thread.
    Pread,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::IoUring => "io_uring",
            Backend::Pread => "pread",
        }
    }
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(text: &str) -> Result<Backend, String> {
        match text {
            "auto" => Ok(Backend::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(Backend::IoUring),
            "pread" => Ok(Backend::Pread),
            other => Err(format!("unknown I/O backend {other:?}: want auto, io_uring or pread")),
        }
    }
}

#[derive(Debug)]
enum Inner {
    #[cfg(target_os = "linux")]
    Uring(super::UringIo),
    Pread(PreadIo),
}

/// The real-file [`Io`]: one of the two backends, chosen once.
#[derive(Debug)]
pub struct SystemIo {
    inner: Inner,
    /// Why `Auto` fell back to pread/pwrite, if it did.
    fallback: Option<String>,
}

impl SystemIo {
    /// Set up `backend`. `Auto` never fails: where io_uring cannot be set up it falls back to
    /// pread/pwrite and keeps the reason ([`SystemIo::fallback`]) for the caller to log.
    pub fn new(backend: Backend) -> io::Result<SystemIo> {
        match backend {
            Backend::Pread => Ok(SystemIo { inner: Inner::Pread(PreadIo::new()), fallback: None }),
            Backend::IoUring => uring().map(|inner| SystemIo { inner, fallback: None }),
            Backend::Auto => Ok(match uring() {
                Ok(inner) => SystemIo { inner, fallback: None },
                Err(error) => SystemIo {
                    inner: Inner::Pread(PreadIo::new()),
                    fallback: Some(format!("io_uring unavailable ({error}); using pread/pwrite")),
                },
            }),
        }
    }

    /// The backend in use: `io_uring` or `pread`.
    pub fn name(&self) -> &'static str {
        match self.inner {
            #[cfg(target_os = "linux")]
            Inner::Uring(_) => Backend::IoUring.name(),
            Inner::Pread(_) => Backend::Pread.name(),
        }
    }

    /// Why [`Backend::Auto`] fell back to pread/pwrite, if it did.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }
}

#[cfg(target_os = "linux")]
fn uring() -> io::Result<Inner> {
    super::UringIo::new().map(Inner::Uring)
}

#[cfg(not(target_os = "linux"))]
fn uring() -> io::Result<Inner> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring exists only on Linux"))
}

/// Forward a call to whichever backend is in use.
macro_rules! forward {
    ($self:ident, $io:ident => $call:expr) => {
        match &$self.inner {
            #[cfg(target_os = "linux")]
            Inner::Uring($io) => $call,
            Inner::Pread($io) => $call,
        }
    };
}

impl Io for SystemIo {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        forward!(self, io => io.submit(operations))
    }

    fn submit_linked(&self, operations: Vec<Linked>) -> Vec<Completion> {
        forward!(self, io => io.submit_linked(operations))
    }
}

impl Namespace for SystemIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        forward!(self, io => io.open(path, mode))
    }

    fn close(&self, file: FileHandle) {
        forward!(self, io => io.close(file));
    }

    fn file_size(&self, file: FileHandle) -> io::Result<u64> {
        forward!(self, io => io.file_size(file))
    }

    fn create_directory(&self, path: &Path) -> io::Result<()> {
        forward!(self, io => io.create_directory(path))
    }

    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>> {
        forward!(self, io => io.list(directory))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        forward!(self, io => io.rename(from, to))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        forward!(self, io => io.remove_file(path))
    }

    fn remove_directory(&self, path: &Path) -> io::Result<()> {
        forward!(self, io => io.remove_directory(path))
    }

    fn lock(&self, path: &Path) -> io::Result<FileHandle> {
        forward!(self, io => io.lock(path))
    }
}
