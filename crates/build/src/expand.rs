//! Docker's rules for variables: `$name`, `${name}` and its modifiers,
//! quotes and the escape character, in the words of `ENV`, `LABEL`,
//! `ARG` and the instructions whose arguments are expanded. Values come
//! from the caller, when the builder reaches the step.

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

/// Splits on whitespace outside quotes, leaving quotes and escapes in the
/// words: Docker's first pass over `ENV`, `LABEL` and `ARG`, which finds
/// the `name=value` words before any is expanded.
pub(crate) fn raw_words(text: &str, escape: char) -> Vec<String> {
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
