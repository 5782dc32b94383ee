//! `cordon config`: the effective configuration, where each value came
//! from, secrets masked.

use crate::settings::{Layers, Settings};
use clap::Args;

#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Override a setting as a command-line flag would (repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::options::parse_setting)]
    pub set: Vec<(String, String)>,
}

pub fn config(args: ConfigArgs) -> i32 {
    let settings = match Settings::load(&Layers::from_process(args.set)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::CONFIG;
        }
    };
    let rows = settings.describe();
    let width = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    let vwidth = rows
        .iter()
        .map(|(_, v, _)| v.chars().count())
        .max()
        .unwrap_or(0)
        .min(48);
    for (key, value, source) in rows {
        println!("{key:<width$}  {value:<vwidth$}  {source}");
    }
    let notice = crate::options::ignored_notice(&settings);
    if !notice.is_empty() {
        println!();
        for line in notice {
            println!("{line}");
        }
    }
    0
}
