//! Files in this user's own tree that a client names: Cursor's agent transcripts. A client says
//! where its transcripts folder is, and any local process can be a client, so the folder is
//! taken only when it is this user's `<home>/.cursor/projects/<project>/agent-transcripts`
//! (compared after canonicalising the home), and every name below the home is opened without
//! following links: a linked `.cursor`, project, `agent-transcripts`, `<id>` folder or
//! `<id>.jsonl` is refused, never written through. Files are regular files owned by this user,
//! created 0600 (folders 0700).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

/// Why a client-named transcripts folder is not used.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the transcripts folder `{0}` is not an absolute path without `.` or `..`")]
    NotPlain(String),
    #[error(
        "the transcripts folder `{0}` is not `<home>/.cursor/projects/<project>/agent-transcripts`"
    )]
    NotCursorsLayout(String),
    #[error("the transcripts folder `{0}` is not under this user's home")]
    NotThisUsersHome(String),
}

/// The folder names below the home, in order.
const LAYOUT: [&str; 2] = [".cursor", "projects"];
const FOLDER: &str = "agent-transcripts";

/// A transcripts folder of this user: the canonical home and the project's folder name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TranscriptsDir {
    home: PathBuf,
    project: OsString,
}

impl TranscriptsDir {
    /// `folder` (as a client named it) when it is `<home>/.cursor/projects/<project>/agent-transcripts`
    /// for this user's `home`, compared after canonicalising both homes.
    pub fn resolve(home: &Path, folder: &str) -> Result<Self, Refused> {
        let path = Path::new(folder);
        let plain = path.is_absolute()
            && path.components().all(|c| {
                matches!(
                    c,
                    Component::RootDir | Component::Prefix(_) | Component::Normal(_)
                )
            });
        if !plain {
            return Err(Refused::NotPlain(folder.to_string()));
        }
        let names: Vec<&OsStr> = path.iter().rev().take(4).collect();
        let layout = names.len() == 4
            && names[0] == FOLDER
            && names[2] == LAYOUT[1]
            && names[3] == LAYOUT[0];
        let (Some(their_home), true) = (path.ancestors().nth(4), layout) else {
            return Err(Refused::NotCursorsLayout(folder.to_string()));
        };
        let same = match (
            std::fs::canonicalize(their_home),
            std::fs::canonicalize(home),
        ) {
            (Ok(a), Ok(b)) if a == b => Some(b),
            _ => None,
        };
        let Some(home) = same else {
            return Err(Refused::NotThisUsersHome(folder.to_string()));
        };
        Ok(TranscriptsDir {
            home,
            project: names[1].to_os_string(),
        })
    }

    /// The folder names from the home down to the conversation's folder.
    fn names<'a>(&'a self, conversation: &'a str) -> [&'a OsStr; 5] {
        [
            OsStr::new(LAYOUT[0]),
            OsStr::new(LAYOUT[1]),
            &self.project,
            OsStr::new(FOLDER),
            OsStr::new(conversation),
        ]
    }

    /// `<conversation>/<file>` opened for appending, folders and file created when missing.
    pub fn open_append(&self, conversation: &str, file: &str) -> std::io::Result<File> {
        imp::open(&self.home, &self.names(conversation), file, true)
    }

    /// `<conversation>/<file>` opened for reading.
    pub(crate) fn open_read(&self, conversation: &str, file: &str) -> std::io::Result<File> {
        imp::open(&self.home, &self.names(conversation), file, false)
    }
}

#[cfg(unix)]
mod imp {
    use std::ffi::OsStr;
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    use rustix::fs::{fstat, mkdirat, openat, FileType, Mode, OFlags, CWD};
    use rustix::io::Errno;

    /// Walks `dirs` below `home` one `openat` at a time, never following a link, then opens
    /// `file` there: a regular file of this user, created 0600 when `append`.
    pub(super) fn open(
        home: &Path,
        dirs: &[&OsStr],
        file: &str,
        append: bool,
    ) -> std::io::Result<File> {
        let mut dir = open_dir(CWD, home.as_os_str())?;
        for name in dirs {
            dir = match open_dir(&dir, name) {
                Err(e) if append && e.kind() == std::io::ErrorKind::NotFound => {
                    match mkdirat(&dir, *name, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    open_dir(&dir, name)?
                }
                other => other?,
            };
        }
        // NONBLOCK: a FIFO in the file's place neither blocks the open nor passes the check.
        let flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let flags = if append {
            flags | OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE
        } else {
            flags | OFlags::RDONLY
        };
        let fd = openat(&dir, file, flags, Mode::from_raw_mode(0o600)).map_err(refusal)?;
        let stat = fstat(&fd)?;
        let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
        if !regular || stat.st_uid != rustix::process::geteuid().as_raw() {
            return Err(not_ours(file));
        }
        Ok(File::from(fd))
    }

    fn open_dir(parent: impl std::os::fd::AsFd, name: &OsStr) -> std::io::Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(parent, name, flags, Mode::empty()).map_err(refusal)?;
        let stat = fstat(&fd)?;
        if stat.st_uid != rustix::process::geteuid().as_raw() {
            return Err(not_ours(&name.to_string_lossy()));
        }
        Ok(fd)
    }

    /// A link where a folder or file should be (`ELOOP`, or `ENOTDIR` for a linked folder)
    /// is named as such; other errors stay what they are.
    fn refusal(e: Errno) -> std::io::Error {
        match e {
            Errno::LOOP | Errno::NOTDIR | Errno::MLINK => not_ours("a link"),
            e => e.into(),
        }
    }

    fn not_ours(what: &str) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{what}: not a plain folder or regular file of this user"),
        )
    }
}

#[cfg(not(unix))]
mod imp {
    use std::ffi::OsStr;
    use std::fs::File;
    use std::path::Path;

    /// Without `openat`: each name is checked with `symlink_metadata` before it is used (a
    /// race with a process that can write in the user's own tree remains).
    pub(super) fn open(
        home: &Path,
        dirs: &[&OsStr],
        file: &str,
        append: bool,
    ) -> std::io::Result<File> {
        let mut path = home.to_path_buf();
        for name in dirs {
            path.push(name);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() && !m.file_type().is_symlink() => {}
                Err(e) if append && e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir(&path)?
                }
                Ok(_) => return Err(not_ours(&name.to_string_lossy())),
                Err(e) => return Err(e),
            }
        }
        path.push(file);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.is_file() => return Err(not_ours(file)),
            _ => {}
        }
        let mut options = std::fs::OpenOptions::new();
        if append {
            options.create(true).append(true);
        } else {
            options.read(true);
        }
        options.open(&path)
    }

    fn not_ours(what: &str) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{what}: not a plain folder or regular file of this user"),
        )
    }
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn layout(home: &Path) -> String {
        home.join(".cursor/projects/ws/agent-transcripts")
            .to_str()
            .expect("utf-8")
            .to_string()
    }

    #[test]
    fn only_cursors_layout_under_this_home_resolves() {
        let home = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        assert!(TranscriptsDir::resolve(home.path(), &layout(home.path())).is_ok());
        let cases = [
            (layout(other.path()), "another home"),
            ("/tmp/b".to_string(), "not the layout"),
            (
                format!(
                    "{}/.cursor/projects/../agent-transcripts",
                    home.path().display()
                ),
                "`..`",
            ),
            (
                format!("{}/notes/agent-transcripts", home.path().display()),
                "not the layout",
            ),
            (
                "relative/.cursor/projects/ws/agent-transcripts".into(),
                "relative",
            ),
            (String::new(), "empty"),
        ];
        for (folder, why) in cases {
            assert!(
                TranscriptsDir::resolve(home.path(), &folder).is_err(),
                "{why}: {folder}"
            );
        }
    }

    #[test]
    fn a_home_reached_through_a_link_is_the_same_home() {
        let home = tempfile::tempdir().expect("tempdir");
        let links = tempfile::tempdir().expect("tempdir");
        let alias = links.path().join("h");
        symlink(home.path(), &alias).expect("symlink");
        let dir = TranscriptsDir::resolve(home.path(), &layout(&alias)).expect("same home");
        dir.open_append("c", "c.jsonl").expect("open");
        assert!(home
            .path()
            .join(".cursor/projects/ws/agent-transcripts/c/c.jsonl")
            .is_file());
    }

    #[test]
    fn new_files_are_0600_and_folders_0700() {
        let home = tempfile::tempdir().expect("tempdir");
        let dir = TranscriptsDir::resolve(home.path(), &layout(home.path())).expect("ours");
        let mut f = dir.open_append("c", "c.jsonl").expect("open");
        f.write_all(b"x\n").expect("write");
        let base = home.path().join(".cursor/projects/ws/agent-transcripts/c");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&base.join("c.jsonl")), 0o600);
        assert_eq!(mode(&base), 0o700);
        let mut text = String::new();
        dir.open_read("c", "c.jsonl")
            .expect("read")
            .read_to_string(&mut text)
            .expect("text");
        assert_eq!(text, "x\n");
    }

    /// Attacks: a link in place of the file, of the conversation's folder, of the project.
    #[test]
    fn links_anywhere_below_the_home_are_refused_and_the_victim_is_unchanged() {
        let home = tempfile::tempdir().expect("tempdir");
        let victim_dir = tempfile::tempdir().expect("tempdir");
        let victim = victim_dir.path().join("bashrc");
        std::fs::write(&victim, "export A=1\n").expect("write");
        let root = home.path().join(".cursor/projects/ws/agent-transcripts");
        std::fs::create_dir_all(root.join("c")).expect("mkdir");
        let dir = TranscriptsDir::resolve(home.path(), &layout(home.path())).expect("ours");

        symlink(&victim, root.join("c/c.jsonl")).expect("symlink");
        assert!(dir.open_append("c", "c.jsonl").is_err(), "a linked file");
        assert!(
            dir.open_read("c", "c.jsonl").is_err(),
            "a linked file, read"
        );

        symlink(victim_dir.path(), root.join("d")).expect("symlink");
        assert!(dir.open_append("d", "bashrc").is_err(), "a linked folder");
        assert!(
            dir.open_read("d", "bashrc").is_err(),
            "a linked folder, read"
        );

        let projects = home.path().join(".cursor/projects");
        symlink(victim_dir.path(), projects.join("p")).expect("symlink");
        let via = projects.join("p/agent-transcripts");
        let dir =
            TranscriptsDir::resolve(home.path(), via.to_str().expect("utf-8")).expect("the layout");
        assert!(dir.open_append("c", "c.jsonl").is_err(), "a linked project");
        assert!(!victim_dir.path().join("agent-transcripts").exists());

        assert_eq!(
            std::fs::read_to_string(&victim).expect("read"),
            "export A=1\n"
        );
    }

    #[test]
    fn a_fifo_in_place_of_the_file_is_refused_at_once() {
        let home = tempfile::tempdir().expect("tempdir");
        let root = home.path().join(".cursor/projects/ws/agent-transcripts/c");
        std::fs::create_dir_all(&root).expect("mkdir");
        let fifo = root.join("c.jsonl");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .expect("mkfifo");
        let dir = TranscriptsDir::resolve(home.path(), &layout(home.path())).expect("ours");
        assert!(dir.open_read("c", "c.jsonl").is_err());
    }
}
