//! `cordon sessions`: the conversations on disk, newest first.

use cordon_agent::sessions;

fn utc(ms: u64) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub fn sessions() -> i32 {
    let all = sessions::list(&sessions::sessions_dir());
    if all.is_empty() {
        println!(
            "no sessions yet (they are kept in {})",
            sessions::sessions_dir().display()
        );
        return 0;
    }
    println!(
        "{:<17} {:<16} {:>5} {:>9}  title",
        "id", "started (UTC)", "turns", "tokens"
    );
    for s in all {
        let tokens = s.usage.prompt_tokens() + s.usage.output_tokens;
        println!(
            "{:<17} {:<16} {:>5} {:>9}  {}",
            s.id,
            utc(s.started_ms),
            s.turns,
            tokens,
            s.title
        );
    }
    0
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates_are_right() {
        assert_eq!(super::utc(0), "1970-01-01 00:00");
        assert_eq!(super::utc(1_795_322_389_000), "2026-11-22 04:39");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00");
    }
}
