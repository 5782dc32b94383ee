//! Draws the app: the transcript, the approval prompt, the input box and
//! the status line, with the session picker over all but the status line
//! when open.

use cordon_tools::printable;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, List, ListItem, ListState, Paragraph, Wrap};

use crate::app::{App, PendingApproval, SandboxState};
use crate::theme;
use cordon_tools::update_plan::{Plan, StepStatus};

pub fn draw(f: &mut Frame<'_>, app: &mut App) {
    let area = f.area();
    let input_rows = (app.input.lines().len() as u16).clamp(1, 8) + 2;
    let approval_rows = approval_rows(app, area.width);
    let plan_rows = plan_rows(app, area.height);
    let [body, plan, approval, input, status] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(plan_rows),
        Constraint::Length(approval_rows),
        Constraint::Length(input_rows),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_transcript(f, app, body);
    if plan_rows > 0 {
        draw_plan(f, app, plan);
    }
    if app.approval.is_some() {
        draw_approval(f, app, approval);
    }
    draw_input(f, app, input);
    draw_status(f, app, status);
    if app.picker.is_some() {
        // Page keys move by half of what the list shows.
        app.view_height = area.height.saturating_sub(3) as usize;
        draw_picker(f, app, area);
    }
}

fn draw_transcript(f: &mut Frame<'_>, app: &mut App, area: Rect) {
    let rows = app.transcript.layout(area.width, app.tick);
    let height = area.height as usize;
    app.view_height = height;
    app.max_top = rows.saturating_sub(height);
    let top = match app.scroll {
        Some(t) if t < app.max_top => t,
        Some(_) => {
            app.scroll = None;
            app.max_top
        }
        None => app.max_top,
    };
    f.render_widget(Paragraph::new(app.transcript.visible(top, height)), area);
    if app.scroll.is_some() && area.height > 0 && area.width > 20 {
        let below = app.max_top - top;
        let tag = format!(" ↓ {below} more rows (End) ");
        let w = tag.chars().count() as u16;
        let r = Rect {
            x: area.x + area.width.saturating_sub(w),
            y: area.y + area.height - 1,
            width: w.min(area.width),
            height: 1,
        };
        f.render_widget(Paragraph::new(Span::styled(tag, theme::selected())), r);
    }
}

/// Most steps the plan panel shows at once.
const PLAN_STEPS_SHOWN: usize = 8;

/// The plan the panel shows: the model's, while it has steps to do or
/// the turn that finished it is still running.
fn shown_plan(app: &App) -> Option<&Plan> {
    app.transcript.plan().filter(|p| app.busy || !p.finished())
}

/// Rows the plan panel takes: its title and up to [`PLAN_STEPS_SHOWN`]
/// steps, never more than a third of the screen.
fn plan_rows(app: &App, height: u16) -> u16 {
    let Some(plan) = shown_plan(app) else {
        return 0;
    };
    let steps = plan.plan.len().min(PLAN_STEPS_SHOWN) as u16;
    (1 + steps).min(height / 3)
}

/// The first step shown when not all fit: the one in progress (or the
/// first not done) stays in view, with one done step above it.
fn plan_window(plan: &Plan, shown: usize) -> usize {
    let at = |want: fn(StepStatus) -> bool| plan.plan.iter().position(|s| want(s.status));
    let focus = at(|s| s == StepStatus::InProgress)
        .or_else(|| at(|s| s != StepStatus::Completed))
        .unwrap_or(plan.plan.len());
    focus
        .saturating_sub(1)
        .min(plan.plan.len().saturating_sub(shown))
}

fn draw_plan(f: &mut Frame<'_>, app: &App, area: Rect) {
    let Some(plan) = shown_plan(app) else { return };
    let shown = area.height.saturating_sub(1) as usize;
    let first = plan_window(plan, shown);
    let more = if shown < plan.plan.len() {
        format!(
            " · steps {}–{}",
            first + 1,
            (first + shown).min(plan.plan.len())
        )
    } else {
        String::new()
    };
    let title = format!(" plan {}/{}{more} ", plan.done(), plan.plan.len());
    let lines: Vec<Line<'_>> = plan
        .plan
        .iter()
        .skip(first)
        .take(shown)
        .map(|s| {
            let style = match s.status {
                StepStatus::Completed => theme::dim(),
                StepStatus::InProgress => theme::running().add_modifier(Modifier::BOLD),
                StepStatus::Pending => Style::default(),
            };
            // Steps are the model's text.
            Line::from(vec![
                Span::styled(format!("{} ", s.status.mark()), style),
                Span::styled(printable(&s.step), style),
            ])
        })
        .collect();
    let block = Block::default()
        .borders(Borders::TOP)
        .border_style(theme::dim())
        .title(Span::styled(title, theme::dim()));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn draw_approval(f: &mut Frame<'_>, app: &App, area: Rect) {
    let Some(a) = &app.approval else { return };
    let what = printable(&a.label);
    let question = Line::from(vec![
        Span::styled("Run ", theme::approval()),
        Span::styled(
            printable(&a.name),
            theme::approval().add_modifier(Modifier::UNDERLINED),
        ),
        Span::styled(format!(" {what}?"), theme::approval()),
    ]);
    let block = Block::default()
        .borders(Borders::TOP)
        .border_style(theme::approval());
    f.render_widget(
        Paragraph::new(vec![question, choices(a)])
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

/// The answers an approval takes, or how to give a reason.
fn choices(a: &PendingApproval) -> Line<'static> {
    if a.denying {
        return Line::from(Span::styled(
            "Type why (it goes back to the model) and press Enter · Esc: back",
            theme::dim(),
        ));
    }
    let mut choices = vec![
        Span::styled("[y]", theme::ok()),
        Span::raw(" yes  "),
        Span::styled("[a]", theme::ok()),
        Span::raw(format!(" always {}, this session  ", printable(&a.name))),
    ];
    if let Some(prefix) = &a.prefix {
        // The words come from the model's command: printable only.
        let words = printable(&prefix.join(" "));
        choices.push(Span::styled("[p]", theme::ok()));
        choices.push(Span::raw(format!(" always `{words} …`  ")));
    }
    choices.push(Span::styled("[n]", theme::error()));
    choices.push(Span::raw(" no, say why"));
    Line::from(choices)
}

/// Rows the approval takes at `width`: its border, the question and the
/// answers, wrapped (a long command's prefix must not push `[n]` off).
fn approval_rows(app: &App, width: u16) -> u16 {
    let Some(a) = &app.approval else { return 0 };
    let w = choices(a).width().max(1) as u16;
    2 + w.div_ceil(width.max(1)).clamp(1, 4)
}

fn draw_input(f: &mut Frame<'_>, app: &mut App, area: Rect) {
    let title = if app.approval.as_ref().is_some_and(|a| a.denying) {
        " reason for denying "
    } else if app.busy {
        " working… Ctrl+C to cancel "
    } else {
        ""
    };
    let border = if app.busy {
        theme::running()
    } else {
        theme::dim()
    };
    app.input.set_block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(border)
            .title(Span::styled(title, border)),
    );
    f.render_widget(&app.input, area);
}

fn draw_status(f: &mut Frame<'_>, app: &App, area: Rect) {
    let s = &app.status;
    let state = match s.sandbox {
        SandboxState::Starting => "sandbox starting",
        SandboxState::Ready => "sandbox ready",
        SandboxState::Busy => "sandbox running",
        SandboxState::Closed => "sandbox closed",
    };
    let sandbox = match s.backend.as_str() {
        "" | "native" => state.to_string(),
        other => format!("{other} {state}"),
    };
    // Plan mode stays in view: it is why nothing changes.
    let sandbox = match app.mode {
        cordon_agent::Mode::Plan => format!("plan mode · {sandbox}"),
        cordon_agent::Mode::Work => sandbox,
    };
    let tokens = s.usage.prompt_tokens() + s.usage.output_tokens;
    let cost = s.cost_usd.map(|c| format!(" ${c:.2}")).unwrap_or_default();
    let pct = if s.context_window > 0 {
        (s.context_tokens as f64 / s.context_window as f64 * 100.0).round() as u64
    } else {
        0
    };
    // Fullest first; a narrow screen drops the workspace, then the model,
    // then the cost, so the sandbox and the context stay in view.
    // The model's name and a resumed session's workspace come from files.
    let (model, workspace) = (printable(&s.model), printable(&s.workspace));
    let lefts = [
        format!(" {model} · {workspace} · {sandbox} "),
        format!(" {model} · {sandbox} "),
        format!(" {sandbox} "),
        String::new(),
    ];
    let rights = [
        format!(" {} tok{cost} · ctx {pct}% ", human(tokens)),
        format!(" ctx {pct}% "),
    ];
    let width = area.width as usize;
    let fits = |l: &String, r: &String| l.chars().count() + r.chars().count() <= width;
    let (left, right) = lefts
        .iter()
        .flat_map(|l| rights.iter().map(move |r| (l, r)))
        .find(|(l, r)| fits(l, r))
        .map_or((String::new(), String::new()), |(l, r)| {
            (l.clone(), r.clone())
        });
    let pad = width.saturating_sub(left.chars().count() + right.chars().count());
    let line = Line::from(vec![
        Span::raw(left),
        Span::raw(" ".repeat(pad)),
        Span::raw(right),
    ]);
    f.render_widget(Paragraph::new(line).style(theme::status()), area);
}

fn human(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 10_000 {
        format!("{}k", n / 1000)
    } else if n >= 1000 {
        format!("{:.1}k", n as f64 / 1000.0)
    } else {
        n.to_string()
    }
}

/// The session picker: the whole screen but the status line, a session
/// to a row (when, turns, title; the workspace when it lists every one),
/// the filter typed so far at the top.
fn draw_picker(f: &mut Frame<'_>, app: &App, area: Rect) {
    let Some(p) = &app.picker else { return };
    let r = Rect {
        height: area.height.saturating_sub(1),
        ..area
    };
    let shown = p.shown();
    let now = p.now;
    let items: Vec<ListItem<'_>> = shown
        .iter()
        .map(|s| {
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_millis(s.started_ms);
            let turns = format!("{} turn{}", s.turns, if s.turns == 1 { "" } else { "s" });
            ListItem::new(Line::from(vec![
                Span::styled(format!("{:>9}  ", ago(now, when)), theme::dim()),
                Span::styled(format!("{turns:>9}  "), theme::dim()),
                // Titles and paths come from session logs: no control
                // character of theirs reaches the terminal.
                Span::styled(
                    printable(&s.title),
                    Style::new().add_modifier(Modifier::BOLD),
                ),
                Span::styled(format!("  {}", s.id), theme::dim()),
                Span::styled(format!("  {}", printable(&s.workspace)), theme::dim()),
            ]))
        })
        .collect();
    let filter = if p.filter.is_empty() {
        "type to filter".to_string()
    } else {
        format!("filter: {}", printable(&p.filter))
    };
    let title = format!(
        " sessions ({} of {}) · {filter} · Enter: load · Esc: close ",
        shown.len(),
        p.sessions.len()
    );
    let list = List::new(items)
        .block(Block::default().borders(Borders::ALL).title(title))
        .highlight_style(theme::selected());
    let mut state = ListState::default().with_selected((!shown.is_empty()).then_some(p.selected));
    f.render_widget(Clear, r);
    f.render_stateful_widget(list, r, &mut state);
}

/// How long before `now` a session started, as a person says it.
fn ago(now: std::time::SystemTime, then: std::time::SystemTime) -> String {
    let s = now.duration_since(then).map_or(0, |d| d.as_secs());
    match s {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        86_400..2_592_000 => format!("{} d ago", s / 86_400),
        _ => humantime::format_rfc3339_seconds(then).to_string()[..10].to_string(),
    }
}
