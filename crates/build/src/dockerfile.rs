//! Dockerfiles read into closed types: each instruction cordon builds is one
//! [`Op`], and anything else is refused with its line rather than skipped,
//! since a step left out silently builds an image other than Docker's.
//!
//! The text is parsed by `parse-dockerfile`. Variables are not expanded
//! here: the builder expands each step's raw text with [`word`], [`words`],
//! [`pairs`] or [`arg_pairs`] when it reaches the step, because only then
//! are the values of `ARG` and `ENV` known.

use parse_dockerfile as pd;

use crate::expand::raw_words;

/// Why a Dockerfile is refused; `line` is 1-based, 0 when no line applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// A Dockerfile cordon can build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The escape character (`\` unless the `# escape=` directive says '`').
    pub escape: char,
    /// `ARG`s before the first `FROM` (each step's op is `Op::Arg`).
    pub global_args: Vec<Step>,
    pub stages: Vec<Stage>,
}

/// One `FROM` and the steps up to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub line: usize,
    /// The image as written (variables not yet expanded), or "scratch".
    pub image: String,
    /// `AS name`, lowercased (Docker's stage names are case-insensitive).
    pub name: Option<String>,
    pub steps: Vec<Step>,
}

/// One instruction after `FROM`, or a global `ARG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1-based line of the instruction's keyword.
    pub line: usize,
    /// The instruction as written, continuation lines joined and runs of
    /// whitespace collapsed to one space: shown in progress, part of cache keys.
    pub text: String,
    pub op: Op,
}

/// What a step does. Text is raw: variables are expanded at build time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Run(Command),
    /// COPY and ADD.
    Copy(Copy),
    /// Raw argument text; expanded and split by `pairs` at build time.
    Env(String),
    Arg(String),
    Label(String),
    Workdir(String),
    User(String),
    Expose(Vec<String>),
    Entrypoint(Command),
    Cmd(Command),
}

/// A command as `RUN`, `CMD` and `ENTRYPOINT` take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Shell form: continuation lines joined, given to the shell unexpanded.
    Shell(String),
    /// Exec form: the JSON array's strings, never expanded.
    Exec(Vec<String>),
}

/// A `COPY` or an `ADD` of files from the context or from another stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// `ADD`: a local tar archive is unpacked at the destination.
    pub add: bool,
    pub from: Option<String>,
    pub chown: Option<String>,
    pub chmod: Option<String>,
    /// Raw (unexpanded) sources, at least one.
    pub sources: Vec<String>,
    pub dest: String,
}

/// The 1-based line holding byte `byte` of `text`.
pub fn line_of(text: &str, byte: usize) -> usize {
    let end = byte.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Whether an `ADD` source is fetched over the network rather than read from
/// the context. Checked again by the builder after expansion, since a
/// variable can hold a URL.
pub fn is_remote(source: &str) -> bool {
    let lower = source.to_ascii_lowercase();
    ["http://", "https://", "git@", "git://", "ssh://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// Parses a Dockerfile, refusing what cordon would not build as Docker does.
pub fn parse(text: &str) -> Result<Dockerfile, ParseError> {
    // The crate drops a BOM and gives spans into the rest: drop it first so
    // that spans index `text`.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Instruction by instruction, so that one refused (say a here-document
    // the crate does not see) is reported before the crate trips on what
    // follows it.
    let instructions = pd::parse_iter(text).map_err(|e| from_crate(text, &e))?;
    let escape = escape_of(text)?;
    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        let instruction = instruction.map_err(|e| from_crate(text, &e))?;
        if let pd::Instruction::From(from) = &instruction {
            let stage = stage(text, from, &stages)?;
            stages.push(stage);
            continue;
        }
        let Some((name, start)) = keyword(&instruction) else {
            return Err(ParseError {
                line: 0,
                message: "an instruction newer than parse-dockerfile 0.1.9 is not supported".into(),
            });
        };
        let line = line_of(text, start);
        let op = op(text, escape, line, name, &instruction)?;
        let step = Step {
            line,
            text: collapse(&logical_line(text, start, escape)),
            op,
        };
        match stages.last_mut() {
            Some(stage) => stage.steps.push(step),
            None if matches!(step.op, Op::Arg(_)) => global_args.push(step),
            None => return Err(before_from(line, name)),
        }
    }
    if stages.is_empty() {
        return Err(ParseError {
            line: 0,
            message: "no FROM: a Dockerfile needs at least one stage".into(),
        });
    }
    Ok(Dockerfile {
        escape,
        global_args,
        stages,
    })
}

fn before_from(line: usize, name: &str) -> ParseError {
    ParseError {
        line,
        message: format!("{name} comes before the first FROM (only ARG may)"),
    }
}

/// The crate's error, its message reworded where it would not name the
/// instruction at fault.
fn from_crate(text: &str, e: &pd::Error) -> ParseError {
    // `#` leaves out the crate's own "at line .. column ..".
    let message = format!("{e:#}");
    let line = e.line();
    if message == "expected FROM" {
        let first = text
            .lines()
            .nth(line.saturating_sub(1))
            .and_then(|l| l.split_whitespace().next());
        if let Some(word) = first {
            return before_from(line, &word.to_ascii_uppercase());
        }
    }
    ParseError { line, message }
}

/// The escape character the directives set. `ParseIter` keeps its
/// directives to itself, so the leading `#` lines, the only place
/// directives can be, are parsed alone ahead of a stand-in stage: the
/// crate reads them exactly as it reads them in the whole text.
fn escape_of(text: &str) -> Result<char, ParseError> {
    let mut end = 0;
    for line in text.split_inclusive('\n') {
        if !line.starts_with('#') {
            break;
        }
        end += line.len();
    }
    let head = format!("{}\nFROM scratch\n", &text[..end]);
    let parsed = pd::parse(&head).map_err(|e| from_crate(&head, &e))?;
    Ok(parsed
        .parser_directives
        .escape
        .map_or('\\', |d| d.value.value))
}

/// The instruction's keyword, named as Docker spells it, and where it starts.
fn keyword(instruction: &pd::Instruction<'_>) -> Option<(&'static str, usize)> {
    use pd::Instruction as I;
    let (name, span) = match instruction {
        I::Add(i) => ("ADD", &i.add.span),
        I::Arg(i) => ("ARG", &i.arg.span),
        I::Cmd(i) => ("CMD", &i.cmd.span),
        I::Copy(i) => ("COPY", &i.copy.span),
        I::Entrypoint(i) => ("ENTRYPOINT", &i.entrypoint.span),
        I::Env(i) => ("ENV", &i.env.span),
        I::Expose(i) => ("EXPOSE", &i.expose.span),
        I::From(i) => ("FROM", &i.from.span),
        I::Healthcheck(i) => ("HEALTHCHECK", &i.healthcheck.span),
        I::Label(i) => ("LABEL", &i.label.span),
        I::Maintainer(i) => ("MAINTAINER", &i.maintainer.span),
        I::Onbuild(i) => ("ONBUILD", &i.onbuild.span),
        I::Run(i) => ("RUN", &i.run.span),
        I::Shell(i) => ("SHELL", &i.shell.span),
        I::Stopsignal(i) => ("STOPSIGNAL", &i.stopsignal.span),
        I::User(i) => ("USER", &i.user.span),
        I::Volume(i) => ("VOLUME", &i.volume.span),
        I::Workdir(i) => ("WORKDIR", &i.workdir.span),
        _ => return None,
    };
    Some((name, span.start))
}

fn stage(
    text: &str,
    from: &pd::FromInstruction<'_>,
    earlier: &[Stage],
) -> Result<Stage, ParseError> {
    let line = line_of(text, from.from.span.start);
    let refuse = |message: String| ParseError { line, message };
    for (_, platform) in flags(line, "FROM", &from.options, &["platform"])? {
        check_platform(platform).map_err(refuse)?;
    }
    let name = match &from.as_ {
        None => None,
        Some((_, name)) => {
            let name = name.value.to_lowercase();
            if !valid_stage_name(&name) {
                return Err(refuse(format!(
                    "stage name '{name}' is not valid: a letter, then letters, digits, '-', '_' or '.'"
                )));
            }
            if let Some(first) = earlier
                .iter()
                .find(|s| s.name.as_deref() == Some(name.as_str()))
            {
                return Err(refuse(format!(
                    "stage name '{name}' is already used by the stage on line {}",
                    first.line
                )));
            }
            Some(name)
        }
    };
    Ok(Stage {
        line,
        image: from.image.value.to_string(),
        name,
        steps: Vec::new(),
    })
}

/// Docker's rule for stage names, so that a name it refuses is refused here.
fn valid_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

/// The platform cordon builds for: this host's, as images never run
/// emulated.
fn host_platform() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("linux/amd64"),
        "aarch64" => Some("linux/arm64"),
        _ => None,
    }
}

fn check_platform(value: &str) -> Result<(), String> {
    let build_args = [
        "$BUILDPLATFORM",
        "${BUILDPLATFORM}",
        "$TARGETPLATFORM",
        "${TARGETPLATFORM}",
    ];
    if build_args.contains(&value) {
        return Ok(());
    }
    match host_platform() {
        Some(host) if value == host => Ok(()),
        Some(host) => Err(format!(
            "FROM --platform={value} is not supported: cordon builds only for this host's platform, {host}"
        )),
        None => Err(format!(
            "FROM --platform={value} is not supported on this host"
        )),
    }
}

/// The flags given, as (name, value), each one of those cordon supports
/// for `instruction`, with a value, and given once.
fn flags<'f>(
    line: usize,
    instruction: &str,
    given: &'f [pd::Flag<'_>],
    allowed: &[&str],
) -> Result<Vec<(&'f str, &'f str)>, ParseError> {
    let refuse = |message: String| ParseError { line, message };
    let mut out: Vec<(&str, &str)> = Vec::new();
    for flag in given {
        let name: &str = &flag.name.value;
        if !allowed.contains(&name) {
            return Err(refuse(format!("{instruction} --{name} is not supported")));
        }
        let value: &str = flag.value.as_ref().map_or("", |v| &*v.value);
        if value.is_empty() {
            return Err(refuse(format!("{instruction} --{name} needs a value")));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(refuse(format!("{instruction} --{name} is given twice")));
        }
        out.push((name, value));
    }
    Ok(out)
}

/// The op of an instruction other than `FROM`.
fn op(
    text: &str,
    escape: char,
    line: usize,
    name: &str,
    instruction: &pd::Instruction<'_>,
) -> Result<Op, ParseError> {
    use pd::Instruction as I;
    let refuse = |message: String| ParseError { line, message };
    let unsupported = || refuse(format!("{name} is not supported by cordon image build"));
    Ok(match instruction {
        I::Run(run) => {
            flags(line, "RUN", &run.options, &[])?;
            let command = command(text, escape, &run.arguments).ok_or_else(unsupported)?;
            let here_doc = match &command {
                Command::Shell(shell) => has_here_doc(shell, escape),
                Command::Exec(_) => false,
            };
            if here_doc || !run.here_docs.is_empty() {
                return Err(refuse("here-documents in RUN are not supported".into()));
            }
            if command == Command::Shell(String::new()) {
                return Err(refuse("RUN needs a command".into()));
            }
            Op::Run(command)
        }
        I::Add(add) => Op::Copy(copy(line, true, &add.options, &add.src, &add.dest)?),
        I::Copy(c) => Op::Copy(copy(line, false, &c.options, &c.src, &c.dest)?),
        I::Env(env) => Op::Env(env.arguments.value.to_string()),
        I::Arg(arg) => Op::Arg(arg.arguments.value.to_string()),
        I::Label(label) => Op::Label(label.arguments.value.to_string()),
        I::Workdir(workdir) => Op::Workdir(workdir.arguments.value.to_string()),
        I::User(user) => Op::User(user.arguments.value.to_string()),
        I::Expose(expose) => Op::Expose(
            expose
                .arguments
                .iter()
                .map(|a| a.value.to_string())
                .collect(),
        ),
        I::Entrypoint(entrypoint) => {
            Op::Entrypoint(command(text, escape, &entrypoint.arguments).ok_or_else(unsupported)?)
        }
        I::Cmd(cmd) => {
            let command = command(text, escape, &cmd.arguments).ok_or_else(unsupported)?;
            if command == Command::Shell(String::new()) {
                return Err(refuse("CMD needs a command".into()));
            }
            Op::Cmd(command)
        }
        I::Healthcheck(_)
        | I::Onbuild(_)
        | I::Shell(_)
        | I::Stopsignal(_)
        | I::Volume(_)
        | I::Maintainer(_) => {
            return Err(unsupported());
        }
        _ => return Err(unsupported()),
    })
}

fn command(text: &str, escape: char, command: &pd::Command<'_>) -> Option<Command> {
    match command {
        pd::Command::Exec(array) => Some(Command::Exec(
            array.value.iter().map(|a| a.value.to_string()).collect(),
        )),
        // The crate leaves a shell form's continuations in place.
        pd::Command::Shell(shell) => Some(Command::Shell(
            logical_line(text, shell.span.start, escape)
                .trim()
                .to_string(),
        )),
        _ => None,
    }
}

fn copy(
    line: usize,
    add: bool,
    options: &[pd::Flag<'_>],
    src: &[pd::Source<'_>],
    dest: &pd::UnescapedString<'_>,
) -> Result<Copy, ParseError> {
    let refuse = |message: String| ParseError { line, message };
    let (name, allowed): (&str, &[&str]) = if add {
        ("ADD", &["chown", "chmod"])
    } else {
        ("COPY", &["from", "chown", "chmod"])
    };
    let flags = flags(line, name, options, allowed)?;
    let flag = |wanted: &str| {
        flags
            .iter()
            .find(|(n, _)| *n == wanted)
            .map(|(_, v)| v.to_string())
    };
    let mut sources = Vec::new();
    for source in src {
        match source {
            pd::Source::Path(path) if add && is_remote(&path.value) => {
                return Err(refuse(format!(
                    "ADD {} is not supported: fetch it in a RUN with --allow",
                    path.value
                )));
            }
            pd::Source::Path(path) => sources.push(path.value.to_string()),
            pd::Source::HereDoc(_) => {
                return Err(refuse(format!(
                    "here-documents in {name} are not supported"
                )));
            }
            _ => {
                return Err(refuse(format!(
                    "a {name} source newer than parse-dockerfile 0.1.9"
                )));
            }
        }
    }
    if sources.is_empty() {
        return Err(refuse(format!("{name} needs a source and a destination")));
    }
    Ok(Copy {
        add,
        from: flag("from"),
        chown: flag("chown"),
        chmod: flag("chmod"),
        sources,
        dest: dest.value.to_string(),
    })
}

/// Whitespace as the crate and Docker see it at the start of a line.
const BLANK: [char; 5] = [' ', '\t', '\r', '\x0b', '\x0c'];

/// The logical line from byte `start`: each line ending in the escape
/// character joined to the next, the escape and newline dropped and the
/// rest kept, and blank or comment lines within it skipped, as Docker
/// joins them.
fn logical_line(text: &str, start: usize, escape: char) -> String {
    let mut out = String::new();
    let mut continued = false;
    for line in text.get(start..).unwrap_or("").split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let content = line.trim_start_matches(BLANK);
        if continued && (content.is_empty() || content.starts_with('#')) {
            continue;
        }
        match line.trim_end_matches([' ', '\t']).strip_suffix(escape) {
            Some(head) => {
                out.push_str(head);
                continued = true;
            }
            None => {
                out.push_str(line);
                break;
            }
        }
    }
    out
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a shell command opens a here-document, by Docker's test: an
/// unquoted word `<<DELIM` or `<<-DELIM`, a descriptor number allowed
/// before it, whose delimiter holds no `<` (so `<<<` is not one).
fn has_here_doc(command: &str, escape: char) -> bool {
    raw_words(command, escape).iter().any(|word| {
        let word = word.trim_start_matches(|c: char| c.is_ascii_digit());
        word.strip_prefix("<<")
            .map(|rest| rest.strip_prefix('-').unwrap_or(rest))
            .is_some_and(|delim| !delim.is_empty() && !delim.contains('<'))
    })
}

#[cfg(test)]
#[path = "dockerfile/tests.rs"]
mod tests;
