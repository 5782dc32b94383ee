//! The values a setting takes, said once: the reference prints
//! [`Ty::describe`], and a test sets every key to [`Ty::samples`] through
//! the parser, which must take the good ones and refuse the bad ones
//! naming the key, so that what the reference says cannot drift from
//! what `resolved.rs` accepts.

/// The type of a setting's value, as text in a file, a variable or
/// `--set`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ty {
    /// Any text.
    Text,
    /// A shell command, not empty.
    Command,
    /// A path on the host.
    Path,
    /// One of these words.
    Word(&'static [&'static str]),
    /// A whole number within bounds (`u64::MAX`: unbounded above).
    Whole { min: u64, max: u64 },
    /// A number within bounds.
    Fraction { min: f64, max: f64 },
    /// A size (`512M`, `2G`) of at least `min`.
    Size { min: &'static str },
    /// A size of at least `min`, or `none`.
    SizeOrNone { min: &'static str },
    /// A duration (`30s`, `10m`, `1h`), or `never`.
    DurationOrNever,
    /// `off`, `on`, or a whole number from 1 to `max`.
    OffOrWhole { max: u64 },
    /// An http or https URL with a host.
    Url,
    /// Network rules and presets: a TOML list, or comma-separated.
    Rules,
    /// `[[network.secrets]]` tables.
    Secrets,
    /// Relative paths in the workspace: a TOML list.
    RelativePaths,
    /// `cordon serve`'s pools: a TOML list, or `;`-separated.
    Pools,
    /// A screen's size, `WIDTHxHEIGHT`.
    Screen,
    /// An image reference.
    Image,
}

impl Ty {
    /// What the reference says of it.
    pub fn describe(self) -> String {
        match self {
            Ty::Text => "text".into(),
            Ty::Command => "a shell command".into(),
            Ty::Path => "a path".into(),
            Ty::Word(words) => {
                let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
                format!("one of {}", quoted.join(", "))
            }
            Ty::Whole { min, max: u64::MAX } => format!("a whole number, at least {min}"),
            Ty::Whole { min, max } => format!("a whole number from {min} to {max}"),
            Ty::Fraction { min, max } => format!("a number from {min} to {max}"),
            Ty::Size { min } => format!("a size (`512M`, `2G`), at least `{min}`"),
            Ty::SizeOrNone { min } => format!("a size (`512M`, `2G`), at least `{min}`, or `none`"),
            Ty::DurationOrNever => "a duration (`30s`, `10m`, `1h`), or `never`".into(),
            Ty::OffOrWhole { max } => format!("`off`, `on`, or a whole number from 1 to {max}"),
            Ty::Url => "an http or https URL".into(),
            Ty::Rules => "a list of network rules and presets".into(),
            Ty::Secrets => "a list of tables (`name`, `from_env`, `hosts`, `env`)".into(),
            Ty::RelativePaths => "a list of relative paths".into(),
            Ty::Pools => "a list of pools".into(),
            Ty::Screen => "`WIDTHxHEIGHT`".into(),
            Ty::Image => "an image reference".into(),
        }
    }

    /// Values of this type, and values outside it (none where any text
    /// will do), as a user would write them on the command line.
    #[cfg(test)]
    pub fn samples(self) -> (Vec<String>, Vec<String>) {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        match self {
            Ty::Text => (v(&["anything at all"]), v(&[])),
            Ty::Command => (v(&["make deps"]), v(&[""])),
            Ty::Path => (v(&["/tmp"]), v(&[])),
            Ty::Word(words) => (v(words), v(&["maybe"])),
            Ty::Whole { min, max } => {
                let mut good = vec![min.to_string()];
                let mut bad = v(&["lots", "1.5"]);
                if min > 0 {
                    bad.push((min - 1).to_string());
                }
                if max != u64::MAX {
                    good.push(max.to_string());
                    bad.push((u128::from(max) + 1).to_string());
                }
                (good, bad)
            }
            Ty::Fraction { min, max } => (
                vec![min.to_string(), max.to_string()],
                vec![
                    (min / 2.0).to_string(),
                    (max * 2.0).to_string(),
                    "half".into(),
                ],
            ),
            Ty::Size { min } => (v(&[min, "64G"]), v(&["lots", "1K"])),
            Ty::SizeOrNone { min } => (v(&["none", min, "64G"]), v(&["lots", "1K"])),
            Ty::DurationOrNever => (v(&["never", "30s", "10m"]), v(&["soon", "0s"])),
            Ty::OffOrWhole { max } => (
                vec!["off".into(), "on".into(), "1".into(), max.to_string()],
                vec![(max + 1).to_string(), "lots".into()],
            ),
            Ty::Url => (
                v(&["https://api.example.com/v1", "http://127.0.0.1:8080"]),
                v(&["ftp://example.com", "example.com", "http://"]),
            ),
            Ty::Rules => (
                v(&[
                    "example.com",
                    "example.com:8443,*.example.org,@python",
                    "[\"10.0.0.0/8\"]",
                ]),
                v(&["@nonesuch", "[1, 2]"]),
            ),
            Ty::Secrets => (
                v(&[r#"[{name = "TOKEN", from_env = "MY_TOKEN", hosts = ["api.example.com"]}]"#]),
                v(&[
                    r#"[{name = "TOKEN"}]"#,
                    r#"[{name = "lower", from_env = "T", hosts = ["a.example"]}]"#,
                ]),
            ),
            Ty::RelativePaths => (
                v(&[r#"["requirements.txt", "a/b"]"#]),
                v(&[r#"["../x"]"#, r#"["/etc"]"#]),
            ),
            Ty::Pools => (
                v(&["4", r#"["4", "2,memory=1G"]"#]),
                v(&["0", "lots", "4,colour=red"]),
            ),
            Ty::Screen => (v(&["1280x800"]), v(&["huge", "10x10"])),
            Ty::Image => (v(&["debian:12", "oci:/var/images/x"]), v(&[])),
        }
    }
}
