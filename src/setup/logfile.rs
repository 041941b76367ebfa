//! The service's log: a file in the data directory, rotated to `<file>.1` (one generation kept)
//! when the next line would take it past its bound, written without colour codes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// A size-bounded log file; each `write` of a formatted line goes in whole to one generation.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    state: Mutex<Open>,
}

#[derive(Debug)]
struct Open {
    file: File,
    size: u64,
}

impl RotatingLog {
    pub fn open(path: &Path, max_bytes: u64) -> io::Result<RotatingLog> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingLog {
            path: path.to_path_buf(),
            max_bytes,
            state: Mutex::new(Open { file, size }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The previous generation.
    pub(crate) fn rotated_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".1");
        PathBuf::from(name)
    }

    /// A poisoned lock only means a panic mid-write elsewhere; the file is still usable.
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_line(&self, buf: &[u8]) -> io::Result<()> {
        let mut open = self.lock();
        if open.size > 0 && open.size + buf.len() as u64 > self.max_bytes {
            open.file.flush()?;
            fs::rename(&self.path, Self::rotated_path(&self.path))?;
            open.file = open_append(&self.path)?;
            open.size = 0;
        }
        open.file.write_all(buf)?;
        open.size += buf.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    // Error text is scrubbed of keys, but the log is still nobody else's business.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The writer handed to the log formatter for one event.
pub struct LogWriter<'a>(&'a RotatingLog);

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_line(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().file.flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RotatingLog {
    type Writer = LogWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter(self)
    }
}

/// The last `lines` lines of the log, the rotated generation first when the current one is short.
pub fn tail(path: &Path, lines: usize) -> io::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for p in [RotatingLog::rotated_path(path), path.to_path_buf()] {
        match fs::read(&p) {
            Ok(bytes) => out.extend(String::from_utf8_lossy(&bytes).lines().map(String::from)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let skip = out.len().saturating_sub(lines);
    Ok(out.split_off(skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_at_the_bound_keeping_one_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let log = RotatingLog::open(&path, 100).unwrap();
        let mut line = [b'a'; 40];
        line[39] = b'\n';
        let mut w = LogWriter(&log);
        // The formatter writes each event as one line in one call.
        for _ in 0..7 {
            w.write_all(&line).unwrap();
        }
        let cur = fs::metadata(&path).unwrap().len();
        let old = fs::metadata(RotatingLog::rotated_path(&path))
            .unwrap()
            .len();
        assert!(cur <= 100 && old <= 100, "{cur} {old}");
        // Two lines fit; after seven, the current file has the 7th, `.1` the 5th and 6th.
        assert_eq!((cur, old), (40, 80));
        let t = tail(&path, 3).unwrap();
        assert_eq!(t.len(), 3);
    }
}
