//! Percentiles and a tiny JSON writer: enough for the reports, without
//! pulling a statistics or serialisation crate into the workspace.

use std::fmt::Write as _;
use std::time::Duration;

/// Order statistics of a set of latencies, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=100).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Summary {
        let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        Summary::of_us(us)
    }

    pub fn of_us(mut us: Vec<f64>) -> Summary {
        us.sort_by(|a, b| a.total_cmp(b));
        let n = us.len();
        let mean = if n == 0 {
            f64::NAN
        } else {
            us.iter().sum::<f64>() / n as f64
        };
        Summary {
            n,
            min: us.first().copied().unwrap_or(f64::NAN),
            p50: percentile(&us, 50.0),
            p90: percentile(&us, 90.0),
            p99: percentile(&us, 99.0),
            max: us.last().copied().unwrap_or(f64::NAN),
            mean,
        }
    }

    pub fn json(&self) -> Json {
        Json::obj([
            ("n", Json::Num(self.n as f64)),
            ("min_us", Json::Num(self.min)),
            ("p50_us", Json::Num(self.p50)),
            ("p90_us", Json::Num(self.p90)),
            ("p99_us", Json::Num(self.p99)),
            ("max_us", Json::Num(self.max)),
            ("mean_us", Json::Num(self.mean)),
        ])
    }
}

/// Microseconds as milliseconds with three decimals.
pub fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

pub const MIB: f64 = 1024.0 * 1024.0;

/// A JSON value, written by hand.
#[derive(Debug, Clone)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn obj<K: Into<String>, I: IntoIterator<Item = (K, Json)>>(items: I) -> Json {
        Json::Obj(items.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        let pad = |out: &mut String, n: usize| out.extend(std::iter::repeat_n(' ', n));
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(x) if x.is_finite() => {
                if x.fract() == 0.0 && x.abs() < 1e15 {
                    let _ = write!(out, "{}", *x as i64);
                } else {
                    let _ = write!(out, "{x:.3}");
                }
            }
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        '\t' => out.push_str("\\t"),
                        c if (c as u32) < 0x20 => {
                            let _ = write!(out, "\\u{:04x}", c as u32);
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                if items.iter().all(|i| matches!(i, Json::Num(_))) {
                    out.push('[');
                    for (i, v) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        v.write(out, indent);
                    }
                    out.push(']');
                    return;
                }
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    pad(out, indent + 2);
                    v.write(out, indent + 2);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push(']');
            }
            Json::Obj(items) => {
                out.push_str("{\n");
                for (i, (k, v)) in items.iter().enumerate() {
                    pad(out, indent + 2);
                    Json::Str(k.clone()).write(out, indent + 2);
                    out.push_str(": ");
                    v.write(out, indent + 2);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, indent);
                out.push('}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 50.0), 7.0);
    }

    #[test]
    fn summary_of_unsorted() {
        let s = Summary::of_us(vec![3.0, 1.0, 2.0, 4.0]);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.max, 4.0);
        assert_eq!(s.mean, 2.5);
    }

    #[test]
    fn json_escapes_and_nests() {
        let j = Json::obj([
            ("a", Json::str("x\"y\n")),
            ("b", Json::Arr(vec![Json::Num(1.0), Json::Num(2.5)])),
            ("c", Json::Null),
            ("d", Json::Bool(true)),
        ]);
        let s = j.render();
        assert!(s.contains(r#""a": "x\"y\n""#));
        assert!(s.contains(r#""b": [1, 2.500]"#));
        assert!(s.contains(r#""c": null"#));
    }
}
