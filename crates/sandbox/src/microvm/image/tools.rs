//! Running the distribution's command-line tools: the decompressors, one
//! per format, and the check of a tool's exit that every run shares.

use std::io::{self, Write};
use std::process::{Command, Output, Stdio};

use super::ImageError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compression {
    Gzip,
    Xz,
    Lzma,
    Zstd,
    Lz4,
    Bzip2,
    Lzo,
}

impl Compression {
    pub(super) fn sniff(data: &[u8]) -> Option<Compression> {
        const MAGICS: &[(&[u8], Compression)] = &[
            (b"\x1f\x8b", Compression::Gzip),
            (b"\xfd7zXZ\x00", Compression::Xz),
            (b"\x5d\x00\x00", Compression::Lzma),
            (b"\x28\xb5\x2f\xfd", Compression::Zstd),
            // The kernel uses lz4's legacy frame.
            (b"\x02\x21\x4c\x18", Compression::Lz4),
            (b"BZh", Compression::Bzip2),
            (b"\x89LZO", Compression::Lzo),
        ];
        MAGICS
            .iter()
            .find(|(magic, _)| data.starts_with(magic))
            .map(|&(_, c)| c)
    }

    /// The command that decompresses stdin to stdout, and its package.
    pub(super) fn tool(self) -> (&'static str, &'static [&'static str], &'static str) {
        match self {
            Compression::Gzip => ("gzip", &["-dc"], "gzip"),
            // Stop at the stream's end, whatever follows it.
            Compression::Xz => ("xz", &["-dc", "--single-stream"], "xz-utils"),
            Compression::Lzma => ("xz", &["-dc", "--format=lzma"], "xz-utils"),
            Compression::Zstd => ("zstd", &["-dcq"], "zstd"),
            Compression::Lz4 => ("lz4", &["-dc"], "lz4"),
            Compression::Bzip2 => ("bzip2", &["-dc"], "bzip2"),
            Compression::Lzo => ("lzop", &["-dc"], "lzop"),
        }
    }
}

/// Decompresses through the format's command-line tool, which every
/// distribution has, rather than a crate per format.
pub(super) fn decompress(
    format: Compression,
    input: &[u8],
    purpose: &'static str,
) -> Result<Vec<u8>, ImageError> {
    let (tool, args, package) = format.tool();
    let mut command = Command::new(tool);
    command.args(args);
    let output = run_with_input(&mut command, input).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ImageError::MissingTool {
                tool,
                package,
                purpose,
            }
        } else {
            ImageError::Command {
                command: tool.into(),
                detail: e.to_string(),
            }
        }
    })?;
    check_output(&format!("{tool} {}", args.join(" ")), output).map(|o| o.stdout)
}

/// Runs `command` with `input` on its stdin, collecting stdout and stderr.
pub(super) fn run_with_input(command: &mut Command, input: &[u8]) -> io::Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Feed stdin from a thread while this one drains stdout, or both
    // sides would block on full pipes.
    std::thread::scope(|s| {
        s.spawn(move || {
            // A tool that exits early closes the pipe (EPIPE); its exit
            // status tells what went wrong.
            let _ = stdin.write_all(input);
        });
        child.wait_with_output()
    })
}

pub(super) fn check_output(command: &str, output: Output) -> Result<Output, ImageError> {
    if output.status.success() {
        return Ok(output);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.trim().lines().rev().take(5).collect();
    let detail = if tail.is_empty() {
        output.status.to_string()
    } else {
        tail.into_iter().rev().collect::<Vec<_>>().join("; ")
    };
    Err(ImageError::Command {
        command: command.to_owned(),
        detail,
    })
}
