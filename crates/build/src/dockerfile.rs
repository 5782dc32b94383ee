//! Dockerfiles read into closed types: each instruction cordon builds is one
//! [`Op`], and anything else is refused with its line rather than skipped,
//! since a step left out silently builds an image other than Docker's.
//!
//! The text is parsed by `parse-dockerfile`. Variables are not expanded
//! here: the builder expands each step's raw text with [`word`], [`words`],
//! [`pairs`] or [`arg_pairs`] when it reaches the step, because only then
//! are the values of `ARG` and `ENV` known.

use parse_dockerfile as pd;

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

/// Why a word could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    #[error("a {0} quote is not closed")]
    UnterminatedQuote(char),
    #[error("bad substitution: {0}")]
    BadSubstitution(String),
    /// `${name:?message}` (or `${name?message}`) met an unset variable.
    #[error("{name}: {message}")]
    Unset { name: String, message: String },
    #[error("a name is empty")]
    EmptyKey,
    #[error("`{0}` is not of the form name=value")]
    MissingEquals(String),
    #[error("`{0}` has no value")]
    NoValue(String),
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

/// Splits on whitespace outside quotes, leaving quotes and escapes in the
/// words: Docker's first pass over `ENV`, `LABEL` and `ARG`, which finds
/// the `name=value` words before any is expanded.
fn raw_words(text: &str, escape: char) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    // A quote makes a word even if empty: `a=""` is a word.
    let mut quoted = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match quote {
            None if c.is_whitespace() => {
                if quoted || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                quoted = false;
            }
            Some('\'') => {
                word.push(c);
                if c == '\'' {
                    quote = None;
                }
            }
            // An escape at the very end is dropped, as Docker drops it.
            _ if c == escape => {
                if let Some(next) = chars.next() {
                    word.push(c);
                    word.push(next);
                }
            }
            None => {
                if c == '\'' || c == '"' {
                    quote = Some(c);
                    quoted = true;
                }
                word.push(c);
            }
            Some(q) => {
                word.push(c);
                if c == q {
                    quote = None;
                }
            }
        }
    }
    if quoted || !word.is_empty() {
        words.push(word);
    }
    words
}

/// Expands variables in `raw` and removes quotes, keeping it one word
/// (used for WORKDIR, USER, FROM's image, COPY's sources and dest, EXPOSE).
pub fn word(
    raw: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ExpandError> {
    let mut out = Built::default();
    Expander::new(raw, escape, vars).run(&mut out, None)?;
    Ok(out.whole)
}

/// The same, split on unquoted whitespace into words, including whitespace
/// an unquoted variable's value brings (as Docker splits it).
pub fn words(
    raw: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ExpandError> {
    let mut out = Built::default();
    Expander::new(raw, escape, vars).run(&mut out, None)?;
    out.end_word();
    Ok(out.words)
}

/// ENV and LABEL: `k=v k2="v 2"` pairs, or the legacy `ENV key the rest of
/// the line` form (one pair, the value the rest of the text after the first
/// whitespace, expanded). Names are expanded too.
///
/// As in Docker, every variable refers to its value before the
/// instruction: in `ENV a=1 b=$a`, `b` gets the old `$a`. So `vars` is the
/// environment before the instruction, and the caller applies all pairs
/// after expanding them.
pub fn pairs(
    raw: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ExpandError> {
    let raw = raw.trim();
    let split = raw_words(raw, escape);
    let Some(first) = split.first() else {
        return Ok(Vec::new());
    };
    if !first.contains('=') {
        let (name, value) = raw
            .split_once(char::is_whitespace)
            .ok_or_else(|| ExpandError::NoValue(raw.into()))?;
        return Ok(vec![(
            name_of(name, escape, vars)?,
            word(value.trim_start(), escape, vars)?,
        )]);
    }
    split
        .iter()
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| ExpandError::MissingEquals(pair.clone()))?;
            Ok((name_of(name, escape, vars)?, word(value, escape, vars)?))
        })
        .collect()
}

/// ARG: `name[=default]` pairs, the default `None` when there is no `=`.
pub fn arg_pairs(
    raw: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, Option<String>)>, ExpandError> {
    raw_words(raw.trim(), escape)
        .iter()
        .map(|arg| match arg.split_once('=') {
            Some((name, value)) => Ok((
                name_of(name, escape, vars)?,
                Some(word(value, escape, vars)?),
            )),
            None => Ok((name_of(arg, escape, vars)?, None)),
        })
        .collect()
}

fn name_of(
    raw: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ExpandError> {
    let name = word(raw, escape, vars)?;
    if name.is_empty() {
        return Err(ExpandError::EmptyKey);
    }
    Ok(name)
}

/// What expansion builds: the whole text, and its words.
#[derive(Default)]
struct Built {
    whole: String,
    words: Vec<String>,
    word: String,
}

impl Built {
    /// Text outside quotes, as written or expanded: its whitespace splits words.
    fn split(&mut self, text: &str) {
        for c in text.chars() {
            self.whole.push(c);
            if c.is_whitespace() {
                self.end_word();
            } else {
                self.word.push(c);
            }
        }
    }

    /// Quoted or escaped text: it stays in its word.
    fn keep(&mut self, text: &str) {
        self.whole.push_str(text);
        self.word.push_str(text);
    }

    fn end_word(&mut self) {
        if !self.word.is_empty() {
            self.words.push(std::mem::take(&mut self.word));
        }
    }
}

/// Docker's shell-like expansion over one raw text.
struct Expander<'v> {
    chars: Vec<char>,
    at: usize,
    escape: char,
    vars: &'v dyn Fn(&str) -> Option<String>,
}

impl<'v> Expander<'v> {
    fn new(raw: &str, escape: char, vars: &'v dyn Fn(&str) -> Option<String>) -> Self {
        Expander {
            chars: raw.chars().collect(),
            at: 0,
            escape,
            vars,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    fn lookup(&self, name: &str) -> String {
        (self.vars)(name).unwrap_or_default()
    }

    /// Expands into `out` up to the end, or up to `until` (the `}` closing
    /// a `${name:-word}`'s word) which must then come.
    fn run(&mut self, out: &mut Built, until: Option<char>) -> Result<(), ExpandError> {
        let mut buf = [0; 4];
        loop {
            let Some(c) = self.next() else {
                return match until {
                    Some(_) => Err(ExpandError::BadSubstitution(
                        "a `${` has no closing `}`".into(),
                    )),
                    None => Ok(()),
                };
            };
            if Some(c) == until {
                return Ok(());
            }
            match c {
                '\'' => out.keep(&self.single_quoted()?),
                '"' => out.keep(&self.double_quoted()?),
                '$' => out.split(&self.dollar()?),
                // An escape at the very end is dropped, as Docker drops it.
                c if c == self.escape => {
                    if let Some(next) = self.next() {
                        out.keep(next.encode_utf8(&mut buf));
                    }
                }
                c => out.split(c.encode_utf8(&mut buf)),
            }
        }
    }

    /// After `'`: everything literal up to the next `'`.
    fn single_quoted(&mut self) -> Result<String, ExpandError> {
        let mut text = String::new();
        loop {
            match self.next() {
                None => return Err(ExpandError::UnterminatedQuote('\'')),
                Some('\'') => return Ok(text),
                Some(c) => text.push(c),
            }
        }
    }

    /// After `"`: variables expand, and the escape character escapes only
    /// `"`, `$` and itself (elsewhere it stays, as in a shell).
    fn double_quoted(&mut self) -> Result<String, ExpandError> {
        let mut text = String::new();
        loop {
            match self.next() {
                None => return Err(ExpandError::UnterminatedQuote('"')),
                Some('"') => return Ok(text),
                Some('$') => text.push_str(&self.dollar()?),
                Some(c) if c == self.escape => match self.peek() {
                    Some(next) if next == '"' || next == '$' || next == self.escape => {
                        text.push(next);
                        self.at += 1;
                    }
                    _ => text.push(c),
                },
                Some(c) => text.push(c),
            }
        }
    }

    /// A variable's name after `$` or `${`: letters, digits and `_`, or a
    /// run of digits, or one of the shell's special parameters (all unset
    /// in a Dockerfile).
    fn name(&mut self) -> String {
        let mut name = String::new();
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while let Some(c) = self.peek().filter(char::is_ascii_digit) {
                    name.push(c);
                    self.at += 1;
                }
            }
            Some(c) if "@*#?-$!".contains(c) => {
                name.push(c);
                self.at += 1;
            }
            _ => {
                while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '_') {
                    name.push(c);
                    self.at += 1;
                }
            }
        }
        name
    }

    /// After `$`: the value, a modifier's result, or `$` itself when no
    /// name follows.
    fn dollar(&mut self) -> Result<String, ExpandError> {
        let missing = || ExpandError::BadSubstitution("a `${` has no closing `}`".into());
        if self.peek() != Some('{') {
            let name = self.name();
            return Ok(if name.is_empty() {
                "$".into()
            } else {
                self.lookup(&name)
            });
        }
        self.at += 1;
        match self.peek() {
            None => return Err(missing()),
            Some(c @ ('{' | '}' | ':')) => {
                return Err(ExpandError::BadSubstitution(format!(
                    "`${{{c}` names no variable"
                )));
            }
            _ => {}
        }
        let name = self.name();
        if name.is_empty() {
            return Err(ExpandError::BadSubstitution(
                "`${` names no variable".into(),
            ));
        }
        let colon = self.peek() == Some(':');
        if colon {
            self.at += 1;
        }
        match self.next() {
            Some('}') if !colon => Ok(self.lookup(&name)),
            Some(modifier @ ('-' | '+' | '?')) => {
                let mut inner = Built::default();
                self.run(&mut inner, Some('}'))?;
                let word = inner.whole;
                let value = (self.vars)(&name);
                // With `:`, empty counts as unset.
                let unset = value.as_deref().is_none_or(|v| colon && v.is_empty());
                match modifier {
                    '-' if unset => Ok(word),
                    '+' if unset => Ok(String::new()),
                    '+' => Ok(word),
                    '?' if unset => {
                        let message = match (word.is_empty(), &value) {
                            (false, _) => word,
                            (true, None) => "is not allowed to be unset".into(),
                            (true, Some(_)) => "is not allowed to be empty".into(),
                        };
                        Err(ExpandError::Unset { name, message })
                    }
                    _ => Ok(value.unwrap_or_default()),
                }
            }
            None => Err(missing()),
            Some(other) => {
                let colon = if colon { ":" } else { "" };
                Err(ExpandError::BadSubstitution(format!(
                    "`${{{name}{colon}{other}`: cordon supports only -, + and ?, each with or without :"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Dockerfile {
        match parse(text) {
            Ok(d) => d,
            Err(e) => panic!("{text:?} refused: {e}"),
        }
    }

    /// The first stage's ops.
    fn ops(text: &str) -> Vec<Op> {
        parsed(text).stages[0]
            .steps
            .iter()
            .map(|s| s.op.clone())
            .collect()
    }

    fn refused(text: &str) -> String {
        match parse(text) {
            Ok(d) => panic!("{text:?} parsed: {d:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn shell(s: &str) -> Op {
        Op::Run(Command::Shell(s.into()))
    }

    fn exec(args: &[&str]) -> Command {
        Command::Exec(args.iter().map(|s| s.to_string()).collect())
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn w(raw: &str, vars: &[(&str, &str)]) -> Result<String, ExpandError> {
        word(raw, '\\', &env(vars))
    }

    fn ws(raw: &str, vars: &[(&str, &str)]) -> Vec<String> {
        words(raw, '\\', &env(vars)).unwrap()
    }

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_simple_dockerfile() {
        let d = parsed("FROM alpine:3.20\nRUN echo hi\nCMD [\"sh\"]\n");
        assert_eq!(d.escape, '\\');
        assert!(d.global_args.is_empty());
        assert_eq!(d.stages.len(), 1);
        let stage = &d.stages[0];
        assert_eq!(
            (stage.line, stage.image.as_str(), stage.name.as_deref()),
            (1, "alpine:3.20", None)
        );
        assert_eq!(
            stage.steps,
            [
                Step {
                    line: 2,
                    text: "RUN echo hi".into(),
                    op: shell("echo hi")
                },
                Step {
                    line: 3,
                    text: "CMD [\"sh\"]".into(),
                    op: Op::Cmd(exec(&["sh"]))
                },
            ]
        );
    }

    #[test]
    fn continuation_lines_join_keeping_whitespace_in_the_command() {
        let d = parsed(
            "FROM a\nRUN apt-get update && \\\n    apt-get install -y \\\n      curl\nUSER me\n",
        );
        let steps = &d.stages[0].steps;
        assert_eq!(
            steps[0].op,
            shell("apt-get update &&     apt-get install -y       curl")
        );
        assert_eq!(
            steps[0].text,
            "RUN apt-get update && apt-get install -y curl"
        );
        assert_eq!(steps[0].line, 2);
        assert_eq!((steps[1].line, &steps[1].op), (5, &Op::User("me".into())));
    }

    #[test]
    fn comments_and_blank_lines_inside_a_continuation_are_dropped() {
        let text = "FROM a\nRUN a \\\n# a comment \\\n  \n   # another\n    b\nUSER x\n";
        let d = parsed(text);
        let steps = &d.stages[0].steps;
        assert_eq!(steps[0].op, shell("a     b"));
        assert_eq!(steps[0].text, "RUN a b");
        assert_eq!(steps[1].line, 7);
    }

    #[test]
    fn an_escape_followed_by_spaces_still_continues() {
        assert_eq!(ops("FROM a\nRUN a \\  \n b\n"), [shell("a  b")]);
    }

    #[test]
    fn crlf_line_endings() {
        let d = parsed("FROM a\r\nRUN a \\\r\n  b\r\nUSER x\r\n");
        let steps = &d.stages[0].steps;
        assert_eq!(steps[0].op, shell("a   b"));
        assert_eq!(
            steps[1],
            Step {
                line: 4,
                text: "USER x".into(),
                op: Op::User("x".into())
            }
        );
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let d = parsed("\u{feff}FROM a\nRUN b\n");
        assert_eq!(
            d.stages[0].steps[0],
            Step {
                line: 2,
                text: "RUN b".into(),
                op: shell("b")
            }
        );
    }

    #[test]
    fn the_backtick_escape_directive() {
        let text = "# escape=`\nFROM mcr.microsoft.com/windows\nRUN dir c:\\ `\n  && echo hi\nWORKDIR c:\\x\nRUN echo \\\nUSER a\n";
        let d = parsed(text);
        assert_eq!(d.escape, '`');
        let steps = &d.stages[0].steps;
        assert_eq!(steps[0].op, shell("dir c:\\   && echo hi"));
        assert_eq!(steps[0].line, 3);
        assert_eq!(steps[1].op, Op::Workdir("c:\\x".into()));
        // A backslash ends no line under the backtick.
        assert_eq!(steps[2].op, shell("echo \\"));
        assert_eq!(
            steps[3],
            Step {
                line: 7,
                text: "USER a".into(),
                op: Op::User("a".into())
            }
        );
    }

    #[test]
    fn the_escape_directive_among_others() {
        let d = parsed("# syntax=docker/dockerfile:1\n# escape=`\n\nFROM a\nRUN x `\n y\n");
        assert_eq!(d.escape, '`');
        assert_eq!(d.stages[0].steps[0].op, shell("x  y"));
        // After the first instruction a directive is a comment.
        let d = parsed("FROM a\n# escape=`\nRUN x \\\n y\n");
        assert_eq!(d.escape, '\\');
        assert_eq!(d.stages[0].steps[0].op, shell("x  y"));
    }

    #[test]
    fn exec_forms_are_json() {
        let text = "FROM a\nRUN [\"/bin/sh\", \"-c\", \"echo \\\"hi\\\" $HOME\"]\nENTRYPOINT [\"/init\"]\nCMD [\"a\", \"b c\"]\nCMD []\n";
        assert_eq!(
            ops(text),
            [
                Op::Run(exec(&["/bin/sh", "-c", "echo \"hi\" $HOME"])),
                Op::Entrypoint(exec(&["/init"])),
                Op::Cmd(exec(&["a", "b c"])),
                Op::Cmd(exec(&[])),
            ]
        );
    }

    #[test]
    fn exec_form_across_lines() {
        assert_eq!(
            ops("FROM a\nRUN [\"a\", \\\n  \"b\"]\n"),
            [Op::Run(exec(&["a", "b"]))]
        );
    }

    #[test]
    fn shell_forms_and_json_that_is_not() {
        let text = "FROM a\nCMD echo $HOME\nENTRYPOINT exec /init \\\n  --flag\nCMD [oops]\nRUN [ -e /x ] || true\n";
        assert_eq!(
            ops(text),
            [
                Op::Cmd(Command::Shell("echo $HOME".into())),
                Op::Entrypoint(Command::Shell("exec /init   --flag".into())),
                Op::Cmd(Command::Shell("[oops]".into())),
                shell("[ -e /x ] || true"),
            ]
        );
    }

    #[test]
    fn an_empty_run_or_cmd_is_refused() {
        assert_eq!(refused("FROM a\nRUN\n"), "line 2: RUN needs a command");
        assert_eq!(refused("FROM a\nCMD\n"), "line 2: CMD needs a command");
    }

    #[test]
    fn multi_stage_with_names_lowercased() {
        let text = "FROM golang:1.22 AS Build\nRUN go build\n\nfrom scratch as Final\nCOPY --from=build /out /app\n";
        let d = parsed(text);
        assert_eq!(d.stages.len(), 2);
        assert_eq!(d.stages[0].name.as_deref(), Some("build"));
        assert_eq!(
            (d.stages[1].line, d.stages[1].image.as_str()),
            (4, "scratch")
        );
        assert_eq!(d.stages[1].name.as_deref(), Some("final"));
        assert_eq!(
            d.stages[1].steps[0].op,
            Op::Copy(Copy {
                add: false,
                from: Some("build".into()),
                chown: None,
                chmod: None,
                sources: vec!["/out".into()],
                dest: "/app".into(),
            })
        );
    }

    #[test]
    fn stage_names_are_unique_whatever_their_case() {
        assert_eq!(
            refused("FROM a AS x\nRUN b\nFROM c AS X\n"),
            "line 3: stage name 'x' is already used by the stage on line 1"
        );
        assert!(refused("FROM a AS x\nFROM c AS x\n").starts_with("line 2: "));
    }

    #[test]
    fn stage_names_follow_dockers_rule() {
        assert!(refused("FROM a AS 1x\n").starts_with("line 1: stage name '1x' is not valid"));
        assert!(refused("FROM a AS b$c\n").starts_with("line 1: stage name"));
        assert_eq!(
            parsed("FROM a AS b-c_d.e1\n").stages[0].name.as_deref(),
            Some("b-c_d.e1")
        );
    }

    #[test]
    fn global_args_and_the_image_as_written() {
        let d = parsed(
            "# a comment\nARG VERSION=1.0\nARG OTHER\nFROM alpine:${VERSION}\nARG VERSION\n",
        );
        assert_eq!(
            d.global_args,
            [
                Step {
                    line: 2,
                    text: "ARG VERSION=1.0".into(),
                    op: Op::Arg("VERSION=1.0".into())
                },
                Step {
                    line: 3,
                    text: "ARG OTHER".into(),
                    op: Op::Arg("OTHER".into())
                },
            ]
        );
        assert_eq!(d.stages[0].image, "alpine:${VERSION}");
        assert_eq!(d.stages[0].steps[0].op, Op::Arg("VERSION".into()));
    }

    #[test]
    fn raw_arguments_of_env_label_workdir_user_expose() {
        let text = "FROM a\nENV a=1 b=\"two  words\"\nENV PATH /x:$PATH\nLABEL \"com.example\"=\"my app\" \\\n  v=1\nWORKDIR /src/$APP\nUSER app:app\nEXPOSE 80 443/tcp\n";
        let d = parsed(text);
        let steps = &d.stages[0].steps;
        let ops: Vec<&Op> = steps.iter().map(|s| &s.op).collect();
        assert_eq!(
            ops,
            [
                &Op::Env("a=1 b=\"two  words\"".into()),
                &Op::Env("PATH /x:$PATH".into()),
                &Op::Label("\"com.example\"=\"my app\"   v=1".into()),
                &Op::Workdir("/src/$APP".into()),
                &Op::User("app:app".into()),
                &Op::Expose(vec!["80".into(), "443/tcp".into()]),
            ]
        );
        assert_eq!(steps[0].text, "ENV a=1 b=\"two words\"");
        assert_eq!(steps[2].text, "LABEL \"com.example\"=\"my app\" v=1");
        assert_eq!(steps[3].line, 6);
    }

    #[test]
    fn copy_and_add_with_their_flags() {
        let text = "FROM a\nCOPY --chown=1:2 --chmod=644 a b* /dst/\nADD --chown=app x.tar /opt/\nCOPY [\"a b\", \"/c d/\"]\n";
        assert_eq!(
            ops(text),
            [
                Op::Copy(Copy {
                    add: false,
                    from: None,
                    chown: Some("1:2".into()),
                    chmod: Some("644".into()),
                    sources: vec!["a".into(), "b*".into()],
                    dest: "/dst/".into(),
                }),
                Op::Copy(Copy {
                    add: true,
                    from: None,
                    chown: Some("app".into()),
                    chmod: None,
                    sources: vec!["x.tar".into()],
                    dest: "/opt/".into(),
                }),
                Op::Copy(Copy {
                    add: false,
                    from: None,
                    chown: None,
                    chmod: None,
                    sources: vec!["a b".into()],
                    dest: "/c d/".into(),
                }),
            ]
        );
    }

    #[test]
    fn instructions_cordon_does_not_build_are_refused_by_line() {
        for name in [
            "HEALTHCHECK CMD true",
            "ONBUILD RUN x",
            "SHELL [\"bash\", \"-c\"]",
            "STOPSIGNAL SIGKILL",
            "VOLUME /data",
            "MAINTAINER me",
        ] {
            let keyword = name.split(' ').next().unwrap();
            let text = format!("# top\nFROM a\n\nRUN x\n\n# c\n{name}\nRUN y\n");
            assert_eq!(
                refused(&text),
                format!("line 7: {keyword} is not supported by cordon image build")
            );
        }
        // Lowercase too.
        assert_eq!(
            refused("FROM a\nvolume /x\n"),
            "line 2: VOLUME is not supported by cordon image build"
        );
    }

    #[test]
    fn run_flags_are_refused_by_name() {
        let text = "FROM a\nRUN x\n\nRUN --mount=type=cache,target=/root/.cache make\n";
        assert_eq!(refused(text), "line 4: RUN --mount is not supported");
        assert_eq!(
            refused("FROM a\nRUN --network=none x\n"),
            "line 2: RUN --network is not supported"
        );
        assert_eq!(
            refused("FROM a\nRUN --security=insecure x\n"),
            "line 2: RUN --security is not supported"
        );
        assert_eq!(
            refused("FROM a\nRUN \\\n  --mount=type=ssh x\n"),
            "line 2: RUN --mount is not supported"
        );
    }

    #[test]
    fn copy_and_add_flags_outside_the_few_are_refused() {
        assert_eq!(
            refused("FROM a\nCOPY --link a b\n"),
            "line 2: COPY --link is not supported"
        );
        assert_eq!(
            refused("FROM a\nCOPY --parents a b\n"),
            "line 2: COPY --parents is not supported"
        );
        assert_eq!(
            refused("FROM a\nADD --from=x a b\n"),
            "line 2: ADD --from is not supported"
        );
        assert_eq!(
            refused("FROM a\nADD --checksum=sha256:00 a b\n"),
            "line 2: ADD --checksum is not supported"
        );
        assert_eq!(
            refused("FROM a\nCOPY --from a b\n"),
            "line 2: COPY --from needs a value"
        );
        assert_eq!(
            refused("FROM a\nCOPY --chown= a b\n"),
            "line 2: COPY --chown needs a value"
        );
        assert_eq!(
            refused("FROM a\nCOPY --from=x --from=y a b\n"),
            "line 2: COPY --from is given twice"
        );
    }

    #[test]
    fn from_platform_only_this_hosts() {
        let host = host_platform().unwrap();
        let d = parsed(&format!("FROM --platform={host} a AS b\n"));
        assert_eq!(
            (d.stages[0].image.as_str(), d.stages[0].name.as_deref()),
            ("a", Some("b"))
        );
        parsed("FROM --platform=$BUILDPLATFORM a\nFROM --platform=${TARGETPLATFORM} b\n");
        let other = if host == "linux/amd64" {
            "linux/arm64"
        } else {
            "linux/amd64"
        };
        assert_eq!(
            refused(&format!("FROM a\nFROM --platform={other} b\n")),
            format!(
                "line 2: FROM --platform={other} is not supported: cordon builds only for this host's platform, {host}"
            )
        );
        assert_eq!(
            refused("FROM --squash a\n"),
            "line 1: FROM --squash is not supported"
        );
    }

    #[test]
    fn add_from_a_url_is_refused() {
        assert_eq!(
            refused("FROM a\n\nADD https://example.com/x.tar.gz /x/\n"),
            "line 3: ADD https://example.com/x.tar.gz is not supported: fetch it in a RUN with --allow"
        );
        assert!(refused("FROM a\nADD a HTTP://h/b /x/\n").starts_with("line 2: ADD HTTP://h/b"));
        assert!(
            refused("FROM a\nADD git@github.com:o/r.git /r\n")
                .starts_with("line 2: ADD git@github.com")
        );
        assert!(is_remote("git://h/r") && is_remote("http://h") && !is_remote("./http"));
    }

    #[test]
    fn here_documents_are_refused() {
        let text = "FROM a\nRUN <<EOF\necho hi\nEOF\n";
        assert_eq!(
            refused(text),
            "line 2: here-documents in RUN are not supported"
        );
        // Not first in the command: the crate would read the body as instructions.
        let text = "FROM a\nRUN cat <<-'EOF' > /x\nRUN not an instruction\nEOF\n";
        assert_eq!(
            refused(text),
            "line 2: here-documents in RUN are not supported"
        );
        assert_eq!(
            refused("FROM a\nRUN x\nRUN python3 2<<EOF\nprint(1)\nEOF\n"),
            "line 3: here-documents in RUN are not supported"
        );
        assert_eq!(
            refused("FROM a\nCOPY <<EOF /x\nhi\nEOF\n"),
            "line 2: here-documents in COPY are not supported"
        );
        assert_eq!(
            refused("FROM a\nADD <<EOF /x\nhi\nEOF\n"),
            "line 2: here-documents in ADD are not supported"
        );
    }

    #[test]
    fn shifts_and_here_strings_are_not_here_documents() {
        let text =
            "FROM a\nRUN echo $((1<<2))\nRUN cat <<< hi\nRUN echo \"<<EOF\" '<<EOF' \\<<EOF\n";
        assert_eq!(
            ops(text),
            [
                shell("echo $((1<<2))"),
                shell("cat <<< hi"),
                shell("echo \"<<EOF\" '<<EOF' \\<<EOF")
            ]
        );
    }

    #[test]
    fn no_from_is_refused() {
        assert_eq!(
            refused(""),
            "line 0: expected at least one FROM instruction"
        );
        assert_eq!(
            refused("# only\nARG x\n"),
            "line 0: expected at least one FROM instruction"
        );
    }

    #[test]
    fn only_arg_may_come_before_from() {
        assert_eq!(
            refused("RUN x\nFROM a\n"),
            "line 1: RUN comes before the first FROM (only ARG may)"
        );
        assert_eq!(
            refused("# c\n\nARG a\nenv a=b\nFROM x\n"),
            "line 4: ENV comes before the first FROM (only ARG may)"
        );
    }

    #[test]
    fn the_crates_errors_keep_their_line() {
        assert_eq!(
            refused("FROM a\n\nFOO bar\n"),
            "line 3: unknown instruction 'FOO'"
        );
        assert_eq!(
            refused("FROM a\nCOPY onlyone\n"),
            "line 2: COPY instruction requires at least two arguments"
        );
        assert!(refused("# escape=x\nFROM a\n").starts_with("line 1: invalid escape"));
    }

    #[test]
    fn line_of_counts_newlines_before() {
        let text = "a\nbc\n\nd";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 1), 1);
        assert_eq!(line_of(text, 2), 2);
        assert_eq!(line_of(text, 5), 3);
        assert_eq!(line_of(text, 6), 4);
        assert_eq!(line_of(text, 100), 4);
    }

    #[test]
    fn plain_and_braced_variables() {
        let vars = [("a", "x"), ("empty", ""), ("_b1", "y")];
        assert_eq!(w("$a/${a}/$_b1.$unset.${unset}", &vars).unwrap(), "x/x/y..");
        assert_eq!(w("pre${a}post", &vars).unwrap(), "prexpost");
        assert_eq!(w("$a$a", &vars).unwrap(), "xx");
        assert_eq!(w("${empty}", &vars).unwrap(), "");
    }

    #[test]
    fn a_dollar_without_a_name_is_literal() {
        assert_eq!(w("cost $ 5 and a$", &[]).unwrap(), "cost $ 5 and a$");
        assert_eq!(w("$/x", &[]).unwrap(), "$/x");
        assert_eq!(w("$1$@", &[]).unwrap(), "");
    }

    #[test]
    fn default_values() {
        let vars = [("set", "v"), ("empty", "")];
        assert_eq!(w("${unset:-d}", &vars).unwrap(), "d");
        assert_eq!(w("${empty:-d}", &vars).unwrap(), "d");
        assert_eq!(w("${set:-d}", &vars).unwrap(), "v");
        assert_eq!(w("${unset-d}", &vars).unwrap(), "d");
        assert_eq!(w("${empty-d}", &vars).unwrap(), "");
        assert_eq!(w("${set-d}", &vars).unwrap(), "v");
        assert_eq!(w("${unset:-}", &vars).unwrap(), "");
    }

    #[test]
    fn alternative_values() {
        let vars = [("set", "v"), ("empty", "")];
        assert_eq!(w("${set:+w}", &vars).unwrap(), "w");
        assert_eq!(w("${empty:+w}", &vars).unwrap(), "");
        assert_eq!(w("${unset:+w}", &vars).unwrap(), "");
        assert_eq!(w("${set+w}", &vars).unwrap(), "w");
        assert_eq!(w("${empty+w}", &vars).unwrap(), "w");
        assert_eq!(w("${unset+w}", &vars).unwrap(), "");
    }

    #[test]
    fn required_values() {
        let vars = [("set", "v"), ("empty", "")];
        assert_eq!(w("${set:?no}", &vars).unwrap(), "v");
        assert_eq!(w("${empty?no}", &vars).unwrap(), "");
        let unset = w("${unset:?give it}", &vars).unwrap_err();
        assert_eq!(
            unset,
            ExpandError::Unset {
                name: "unset".into(),
                message: "give it".into()
            }
        );
        assert_eq!(unset.to_string(), "unset: give it");
        assert_eq!(
            w("${unset?}", &vars).unwrap_err().to_string(),
            "unset: is not allowed to be unset"
        );
        assert_eq!(
            w("${empty:?}", &vars).unwrap_err().to_string(),
            "empty: is not allowed to be empty"
        );
    }

    #[test]
    fn modifier_words_expand_and_unquote() {
        let vars = [("b", "x")];
        assert_eq!(w("${a:-${b}}", &vars).unwrap(), "x");
        assert_eq!(w("${a:-$b/y}", &vars).unwrap(), "x/y");
        assert_eq!(w("${a:-\"x y\"}", &vars).unwrap(), "x y");
        assert_eq!(w("${a:-'}'}", &vars).unwrap(), "}");
        assert_eq!(w("${a:-\\}}", &vars).unwrap(), "}");
        assert_eq!(w("${b:+${c:-z}}", &vars).unwrap(), "z");
    }

    #[test]
    fn bad_substitutions() {
        for bad in [
            "${a", "${a:-b", "${", "${}", "${:a}", "${{a}}", "${a%b}", "${a:}", "${a:=b}", "${ a}",
            "${a#b}",
        ] {
            match w(bad, &[("a", "v")]) {
                Err(ExpandError::BadSubstitution(_)) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn quotes() {
        let vars = [("a", "x")];
        assert_eq!(w("'$a b'", &vars).unwrap(), "$a b");
        assert_eq!(w("\"$a b\"", &vars).unwrap(), "x b");
        assert_eq!(w("\"it's\"", &vars).unwrap(), "it's");
        assert_eq!(w("'say \"hi\"'", &vars).unwrap(), "say \"hi\"");
        assert_eq!(w("a\"b c\"d'e f'", &vars).unwrap(), "ab cde f");
        assert_eq!(w("'\\'", &vars).unwrap(), "\\");
        assert_eq!(
            w("'abc", &vars).unwrap_err(),
            ExpandError::UnterminatedQuote('\'')
        );
        assert_eq!(
            w("\"abc", &vars).unwrap_err(),
            ExpandError::UnterminatedQuote('"')
        );
        assert_eq!(
            w("\"${a}", &vars).unwrap_err(),
            ExpandError::UnterminatedQuote('"')
        );
    }

    #[test]
    fn escapes() {
        let vars = [("a", "x")];
        assert_eq!(w("\\$a", &vars).unwrap(), "$a");
        assert_eq!(w("a\\ b", &vars).unwrap(), "a b");
        assert_eq!(w("\\\"q\\'", &vars).unwrap(), "\"q'");
        assert_eq!(w("c:\\\\x", &vars).unwrap(), "c:\\x");
        assert_eq!(w("end\\", &vars).unwrap(), "end");
        // In double quotes only ", $ and the escape itself are escaped.
        assert_eq!(
            w("\"a\\\"b \\$a \\\\ \\n\"", &vars).unwrap(),
            "a\"b $a \\ \\n"
        );
        // The backtick escapes instead, and a backslash is a character.
        let v = env(&vars);
        assert_eq!(word("`$a c:\\x", '`', &v).unwrap(), "$a c:\\x");
        assert_eq!(word("\"`\"`$a\"", '`', &v).unwrap(), "\"$a");
        assert_eq!(word("\\$a", '`', &v).unwrap(), "\\x");
    }

    #[test]
    fn words_split_on_unquoted_whitespace() {
        let vars = [("two", "x  y"), ("empty", "")];
        assert_eq!(ws("a b\t c", &vars), ["a", "b", "c"]);
        assert_eq!(ws("  \"a b\" 'c d'e ", &vars), ["a b", "c de"]);
        assert_eq!(ws("a\\ b", &vars), ["a b"]);
        assert_eq!(ws("$two", &vars), ["x", "y"]);
        assert_eq!(ws("\"$two\"", &vars), ["x  y"]);
        assert_eq!(ws("p$two", &vars), ["px", "y"]);
        assert_eq!(ws("$empty '' \"\"", &vars), Vec::<String>::new());
        assert_eq!(ws("", &vars), Vec::<String>::new());
        // One word keeps its whitespace.
        assert_eq!(w("a  $two", &vars).unwrap(), "a  x  y");
    }

    #[test]
    fn env_pairs() {
        let vars = env(&[("x", "v"), ("a", "old")]);
        let got = pairs("a=1 b=\"two words\" c=$x d=${x}-'$x' e=", '\\', &vars).unwrap();
        assert_eq!(
            got,
            owned(&[
                ("a", "1"),
                ("b", "two words"),
                ("c", "v"),
                ("d", "v-$x"),
                ("e", "")
            ])
        );
        // Each value sees the environment from before the instruction.
        assert_eq!(
            pairs("a=1 b=$a", '\\', &vars).unwrap(),
            owned(&[("a", "1"), ("b", "old")])
        );
        assert_eq!(
            pairs("a=x\\ y b=c\\=d", '\\', &vars).unwrap(),
            owned(&[("a", "x y"), ("b", "c=d")])
        );
        assert_eq!(pairs("", '\\', &vars).unwrap(), owned(&[]));
    }

    #[test]
    fn env_legacy_form() {
        let vars = env(&[("base", "/opt")]);
        assert_eq!(
            pairs("key the rest  of it", '\\', &vars).unwrap(),
            owned(&[("key", "the rest  of it")])
        );
        assert_eq!(
            pairs("PATH   $base/bin:\"a b\"", '\\', &vars).unwrap(),
            owned(&[("PATH", "/opt/bin:a b")])
        );
        assert_eq!(pairs("K a=b", '\\', &vars).unwrap(), owned(&[("K", "a=b")]));
        assert_eq!(
            pairs("lonely", '\\', &vars).unwrap_err(),
            ExpandError::NoValue("lonely".into())
        );
    }

    #[test]
    fn env_pair_errors() {
        let vars = env(&[]);
        assert_eq!(
            pairs("a=1 b", '\\', &vars).unwrap_err(),
            ExpandError::MissingEquals("b".into())
        );
        assert_eq!(pairs("=x", '\\', &vars).unwrap_err(), ExpandError::EmptyKey);
        assert_eq!(
            pairs("$unset=x", '\\', &vars).unwrap_err(),
            ExpandError::EmptyKey
        );
        assert_eq!(
            pairs("a=\"b", '\\', &vars).unwrap_err(),
            ExpandError::UnterminatedQuote('"')
        );
    }

    #[test]
    fn label_pairs_with_quotes() {
        let vars = env(&[]);
        let got = pairs(
            "\"com.example.name\"=\"my app\" version=1.0 desc=\"say \\\"hi\\\"\" 'single'='a  b'",
            '\\',
            &vars,
        )
        .unwrap();
        assert_eq!(
            got,
            owned(&[
                ("com.example.name", "my app"),
                ("version", "1.0"),
                ("desc", "say \"hi\""),
                ("single", "a  b")
            ])
        );
        // The raw text of a LABEL across lines, as parse gives it.
        let d = parsed("FROM a\nLABEL a=1 \\\n  b=\"x y\"\n");
        let Op::Label(raw) = &d.stages[0].steps[0].op else {
            panic!()
        };
        assert_eq!(
            pairs(raw, d.escape, &vars).unwrap(),
            owned(&[("a", "1"), ("b", "x y")])
        );
    }

    #[test]
    fn arg_with_and_without_default() {
        let vars = env(&[("x", "v")]);
        let want: Vec<(String, Option<String>)> = vec![
            ("A".into(), None),
            ("B".into(), Some("2".into())),
            ("C".into(), Some(String::new())),
            ("D".into(), Some("a b".into())),
            ("E".into(), Some("v".into())),
            ("F".into(), Some("d".into())),
        ];
        assert_eq!(
            arg_pairs("A B=2 C= D=\"a b\" E=${x:-d} F=${y:-d}", '\\', &vars).unwrap(),
            want
        );
        assert_eq!(
            arg_pairs("=x", '\\', &vars).unwrap_err(),
            ExpandError::EmptyKey
        );
    }

    #[test]
    fn raw_words_keep_quotes_and_escapes() {
        assert_eq!(
            raw_words("a=\"b c\" d='e \"f' g\\ h \"\" x\\", '\\'),
            ["a=\"b c\"", "d='e \"f'", "g\\ h", "\"\"", "x"]
        );
        assert_eq!(raw_words("a=\"b\\\" c\"", '\\'), ["a=\"b\\\" c\""]);
    }
}
