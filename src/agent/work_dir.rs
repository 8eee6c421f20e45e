//! The agent's work dir, trusted only as far as it is checked (docs/real-mode.md, "The work dir"). Linux; not in
//! simulator builds.
//!
//! The agent acts on what it finds in its work dir: a job record there makes it kill processes, and it creates,
//! truncates and changes the mode of files in sandboxes. So:
//! - the work dir must be owned by the agent's effective user and not writable by group or others
//!   ([`DirHandle::open_work_dir`]), else the agent refuses to start: whoever can write it could plant records or
//!   links;
//! - its path is resolved once, when it is opened (it may be a symbolic link an administrator made); from then on
//!   the agent holds it by descriptor and reaches every entry under it relative to that descriptor (`openat`,
//!   `mkdirat`, `renameat`, `unlinkat`) without following a symbolic link (`O_NOFOLLOW`): a link planted at a
//!   sandbox, an output file or a record is an error, never a way out of the work dir. A directory under it must be
//!   owned by the agent's user; a file it writes must be a regular file with one link (a hard link planted at an
//!   output file would make the agent truncate the file it points to). A job's shell starts in its sandbox by
//!   `fchdir` on the sandbox's descriptor, not by its path.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The bits of a work dir's mode that must be clear: write by group, write by others.
pub const WORK_DIR_MODE_FORBIDDEN: u32 = 0o022;

/// The most bytes [`DirHandle::read_file`] reads: 1 MiB, far past a job record (a few hundred bytes); a bigger file
/// there was not written by an agent.
pub const READ_BYTES_MAX: u64 = 1 << 20;

/// A directory held open by descriptor; its entries are reached relative to it, never through a symbolic link
/// (module docs).
#[derive(Debug)]
pub struct DirHandle {
    fd: OwnedFd,
    path: PathBuf,
}

impl DirHandle {
    /// Opens the work dir `path`, creating it (mode 0700, with its missing parents) if absent, and checks that it
    /// is a directory owned by the agent's effective user that group and others cannot write. Blocking.
    ///
    /// Errors: the rule it breaks or the failing call, as a message (the caller names the directory).
    pub fn open_work_dir(path: &Path) -> Result<DirHandle, String> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|error| format!("cannot create it: {error}"))?;
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|error| format!("cannot open it: {}", io::Error::from(error)))?;
        let stat =
            rustix::fs::fstat(&fd).map_err(|error| format!("cannot read its status: {}", io::Error::from(error)))?;
        let agent = rustix::process::geteuid().as_raw();
        if stat.st_uid != agent {
            return Err(format!(
                "owned by uid {}, not by the agent's user (uid {agent}): the agent acts on the job records and \
                 sandboxes it finds there, so it works only in a directory of its own user",
                stat.st_uid
            ));
        }
        let mode = stat.st_mode & 0o7777;
        if mode & WORK_DIR_MODE_FORBIDDEN != 0 {
            let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
                (true, true) => "group and others",
                (true, false) => "its group",
                _ => "others",
            };
            return Err(format!(
                "mode {mode:04o} lets {who} write it: anyone who can write it could plant job records or links that \
                 the agent acts on; make it writable by its owner only (chmod go-w)"
            ));
        }
        Ok(DirHandle { fd, path: path.to_path_buf() })
    }

    /// Opens `path`, a directory that must not be a symbolic link itself, as a handle (tests open a work dir's job
    /// records this way). Blocking.
    pub fn open(path: &Path) -> io::Result<DirHandle> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|error| explain(error, path))?;
        Ok(DirHandle { fd, path: path.to_path_buf() })
    }

    /// The path the directory was opened at (for messages and for reading it from outside the agent).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor (a job's shell changes into its sandbox with it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory `name` in this one, created if absent, opened without following a link, checked to be owned by
    /// the agent's user, and given `mode` (also when it already existed). Blocking.
    ///
    /// Errors: `name` is not one plain component, it is a symbolic link or not a directory, another user owns it,
    /// or a call failed; the message names the path.
    pub fn subdir(&self, name: &str, mode: u32) -> io::Result<DirHandle> {
        let path = self.entry(name)?;
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(error) => return Err(explain(error, &path)),
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd =
            rustix::fs::openat(&self.fd, name, flags, Mode::empty()).map_err(|error| self.open_error(error, name))?;
        let stat = rustix::fs::fstat(&fd).map_err(|error| explain(error, &path))?;
        let agent = rustix::process::geteuid().as_raw();
        if stat.st_uid != agent {
            return Err(refused(
                &path,
                &format!("is owned by uid {}, not by the agent's user (uid {agent})", stat.st_uid),
            ));
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|error| explain(error, &path))?;
        Ok(DirHandle { fd, path })
    }

    /// The file `name` in this directory, created (or emptied) for writing, with `mode` (also when it already
    /// existed). It is opened without following a link and without blocking on a named pipe, and must be a regular
    /// file with one link before it is emptied. Blocking.
    ///
    /// Errors: `name` is not one plain component, it is a symbolic link, not a regular file or has other links, or a
    /// call failed; the message names the path.
    pub fn create_file(&self, name: &str, mode: u32) -> io::Result<File> {
        let path = self.entry(name)?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode))
            .map_err(|error| explain(error, &path))?;
        let stat = rustix::fs::fstat(&fd).map_err(|error| explain(error, &path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(refused(&path, "is not a regular file"));
        }
        if stat.st_nlink != 1 {
            return Err(refused(&path, &format!("has {} links (a hard link is not written through)", stat.st_nlink)));
        }
        let blocking = rustix::fs::fcntl_getfl(&fd).map_err(|error| explain(error, &path))? - OFlags::NONBLOCK;
        rustix::fs::fcntl_setfl(&fd, blocking).map_err(|error| explain(error, &path))?;
        rustix::fs::ftruncate(&fd, 0).map_err(|error| explain(error, &path))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|error| explain(error, &path))?;
        Ok(File::from(fd))
    }

    /// The contents of the regular file `name` in this directory, opened without following a link, at most
    /// [`READ_BYTES_MAX`] bytes. Blocking.
    ///
    /// Errors: as [`DirHandle::create_file`], or the file is longer.
    pub fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        let path = self.entry(name)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::empty()).map_err(|error| explain(error, &path))?;
        let stat = rustix::fs::fstat(&fd).map_err(|error| explain(error, &path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(refused(&path, "is not a regular file"));
        }
        let mut text = Vec::new();
        File::from(fd).take(READ_BYTES_MAX + 1).read_to_end(&mut text)?;
        if text.len() as u64 > READ_BYTES_MAX {
            return Err(refused(&path, &format!("is longer than {READ_BYTES_MAX} bytes")));
        }
        Ok(text)
    }

    /// Renames the entry `from` to `to`, both in this directory (a link is renamed, not followed). Blocking.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (from_path, _) = (self.entry(from)?, self.entry(to)?);
        rustix::fs::renameat(&self.fd, from, &self.fd, to).map_err(|error| explain(error, &from_path))
    }

    /// Removes the entry `name` (a file or link; a link is removed, not followed). Blocking.
    ///
    /// Errors: as the call's, with the kind kept (`NotFound` for an absent entry).
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        let path = self.entry(name)?;
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(|error| explain(error, &path))
    }

    /// The names of the entries of this directory (not `.` and `..`), in no particular order; names that are not
    /// UTF-8 are left out (the agent writes none). Blocking.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let entries = rustix::fs::Dir::read_from(&self.fd).map_err(|error| explain(error, &self.path))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| explain(error, &self.path))?;
            if let Ok(name) = entry.file_name().to_str()
                && name != "."
                && name != ".."
            {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    /// The error of an `openat` of `name` with `O_NOFOLLOW`: a symbolic link fails with `ELOOP`, or with `ENOTDIR`
    /// when a directory was asked for; the message says which.
    fn open_error(&self, error: Errno, name: &str) -> io::Error {
        let path = self.path.join(name);
        let link = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Symlink);
        explain(if link { Errno::LOOP } else { error }, &path)
    }

    /// The path of `name`, checked to be one plain component (no `/`, not `.` or `..`, not empty).
    fn entry(&self, name: &str) -> io::Result<PathBuf> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} in {} is not a plain file name", self.path.display()),
            ));
        }
        Ok(self.path.join(name))
    }
}

/// A failed call on `path` as an `io::Error` of the same kind whose message names the path, and says so when the
/// cause is a symbolic link the agent would not follow (`ELOOP` from `O_NOFOLLOW`).
fn explain(error: Errno, path: &Path) -> io::Error {
    let kind = io::Error::from(error).kind();
    let message = match error {
        Errno::LOOP => format!("{} is a symbolic link; the agent follows none under its work dir", path.display()),
        error => format!("{}: {}", path.display(), io::Error::from(error)),
    };
    io::Error::new(kind, message)
}

/// A refusal of `path` for `why`.
fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{} {why}; refused", path.display()))
}
