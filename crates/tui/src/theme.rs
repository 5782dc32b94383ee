//! Colours and styles. Only the 16 ANSI colours and modifiers: they work in
//! every terminal, true colour or not, and follow the user's palette.

use ratatui::style::{Color, Modifier, Style};

pub fn dim() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn heading(level: usize) -> Style {
    let s = Style::new().add_modifier(Modifier::BOLD);
    match level {
        1 => s.fg(Color::Magenta).add_modifier(Modifier::UNDERLINED),
        2 => s.fg(Color::Magenta),
        _ => s.fg(Color::Blue),
    }
}

pub fn quote() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn list_marker() -> Style {
    Style::new().fg(Color::Cyan)
}

pub fn inline_code() -> Style {
    Style::new().fg(Color::Yellow)
}

pub fn code() -> Style {
    Style::new().fg(Color::Gray)
}

pub fn code_frame() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn link() -> Style {
    Style::new()
        .fg(Color::Blue)
        .add_modifier(Modifier::UNDERLINED)
}

pub fn table_rule() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn user() -> Style {
    Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD)
}

pub fn tool_name() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

pub fn ok() -> Style {
    Style::new().fg(Color::Green)
}

pub fn error() -> Style {
    Style::new().fg(Color::Red)
}

pub fn error_bold() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

pub fn running() -> Style {
    Style::new().fg(Color::Yellow)
}

pub fn added() -> Style {
    Style::new().fg(Color::Green)
}

pub fn removed() -> Style {
    Style::new().fg(Color::Red)
}

pub fn hunk() -> Style {
    Style::new().fg(Color::Cyan)
}

pub fn status() -> Style {
    Style::new().bg(Color::Blue).fg(Color::White)
}

pub fn notice() -> Style {
    Style::new().fg(Color::Blue)
}

pub fn approval() -> Style {
    Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)
}

pub fn selected() -> Style {
    Style::new().add_modifier(Modifier::REVERSED)
}
