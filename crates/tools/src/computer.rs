//! `computer`: the mouse, keyboard and screen of the sandbox's display,
//! with the action set of Anthropic's computer-use tool. Every action runs
//! inside the sandbox (`xdotool`, `xwd`); screenshots are decoded, scaled
//! to a standard size (XGA, WXGA or FWXGA, by aspect ratio) and encoded as
//! PNG here. The model works in the scaled coordinates; they are mapped
//! back to the screen's, and a point off the screen is an error.

use std::time::Duration;

use base64::Engine;
use cordon_sandbox::ExecRequest;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::screen::{self, Scaling};
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool};

pub struct Computer;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Action {
    Screenshot,
    LeftClick,
    RightClick,
    MiddleClick,
    DoubleClick,
    TripleClick,
    MouseMove,
    LeftClickDrag,
    LeftMouseDown,
    LeftMouseUp,
    Scroll,
    Key,
    Type,
    HoldKey,
    Wait,
    CursorPosition,
    Zoom,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Direction {
    Up,
    Down,
    Left,
    Right,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    action: Action,
    #[serde(default)]
    coordinate: Option<[i64; 2]>,
    #[serde(default)]
    start_coordinate: Option<[i64; 2]>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    scroll_direction: Option<Direction>,
    #[serde(default)]
    scroll_amount: Option<u32>,
    #[serde(default)]
    duration: Option<f64>,
    #[serde(default)]
    region: Option<[i64; 4]>,
}

/// Whether `input` is a valid call, without running it: for callers that
/// check requests before queueing them (the server's `gui` jobs).
pub fn check(input: &Value) -> Result<(), String> {
    serde_json::from_value::<Input>(input.clone())
        .map(|_| ())
        .map_err(|e| format!("invalid computer action: {e}"))
}

fn point_schema(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
           "description": description})
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": [
                "screenshot", "left_click", "right_click", "middle_click", "double_click",
                "triple_click", "mouse_move", "left_click_drag", "left_mouse_down",
                "left_mouse_up", "scroll", "key", "type", "hold_key", "wait",
                "cursor_position", "zoom"
            ], "description": "What to do."},
            "coordinate": point_schema("[x, y] in the screenshot's pixels: where to click, move, scroll or end a drag."),
            "start_coordinate": point_schema("[x, y] where left_click_drag starts."),
            "text": {"type": "string", "description": "For `type`: the text. For `key` and `hold_key`: xdotool key names, e.g. `Return`, `ctrl+s`, `alt+Tab` (several separated by spaces). For clicks and scroll: modifier keys held meanwhile, e.g. `shift`."},
            "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
            "scroll_amount": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Scroll wheel clicks. Default 3."},
            "duration": {"type": "number", "minimum": 0, "maximum": 60, "description": "Seconds, for `wait` and `hold_key`."},
            "region": {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4, "description": "For `zoom`: [x0, y0, x1, y1], the part of the screen to see in full detail."}
        },
        "required": ["action"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Use the mouse and keyboard of the sandbox's graphical display, and see it. `screenshot` shows the screen; coordinates are pixels of that screenshot. Clicks, drags and scrolls take `coordinate`; `key` presses keys by xdotool name (`Return`, `ctrl+s`); `type` types text; `wait` pauses. Actions that change the screen return a screenshot taken just after. Check each step on the screenshot before the next.";

/// An action's or a direction's name, as the model writes it.
fn word(v: impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl TypedTool for Computer {
    const NAME: &'static str = "computer";
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        let mut label = word(input.action);
        if let Some([x, y]) = input.start_coordinate {
            label.push_str(&format!(" from ({x}, {y})"));
        }
        if let Some([x, y]) = input.coordinate {
            label.push_str(&format!(" at ({x}, {y})"));
        }
        if let Some(d) = input.scroll_direction {
            label.push_str(&format!(" {}", word(d)));
        }
        if let Some(text) = &input.text {
            label.push_str(&format!(" {text}"));
        }
        label
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        Box::pin(async move {
            match run(ctx, input).await {
                Ok(out) => out,
                Err(e) => ToolOutput::error(e),
            }
        })
    }
}

/// Runs a command in the sandbox; its stdout, or its stderr as the error.
async fn sh(ctx: &ToolContext, argv: Vec<String>) -> Result<Vec<u8>, String> {
    let out = ctx
        .sandbox
        .exec(
            ExecRequest::argv(argv.clone())
                .output_limit(64 * 1024 * 1024)
                .timeout(Duration::from_secs(90)),
        )
        .await
        .map_err(|e| format!("the sandbox failed: {e}"))?;
    if out.status != cordon_sandbox::ExitStatus::Code(0) {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(format!(
            "{} failed: {}",
            argv[0],
            if err.is_empty() { "no message" } else { &err }
        ));
    }
    Ok(out.stdout)
}

async fn geometry(ctx: &ToolContext) -> Result<Scaling, String> {
    let out = sh(ctx, vec!["xdotool".into(), "getdisplaygeometry".into()])
        .await
        .map_err(|e| {
            format!("this sandbox has no usable display ({e}); start it with a display")
        })?;
    let text = String::from_utf8_lossy(&out);
    let mut it = text.split_whitespace().map(str::parse::<u32>);
    match (it.next(), it.next()) {
        (Some(Ok(w)), Some(Ok(h))) if w > 0 && h > 0 => Ok(Scaling::for_screen(w, h)),
        _ => Err(format!("unexpected display geometry {text:?}")),
    }
}

async fn capture(ctx: &ToolContext) -> Result<screen::Rgb, String> {
    let dump = sh(ctx, vec!["xwd".into(), "-root".into(), "-silent".into()]).await?;
    screen::decode_xwd(&dump)
}

/// The screen as the model sees it, with a line saying so.
async fn screenshot(ctx: &ToolContext, s: &Scaling, note: &str) -> Result<ToolOutput, String> {
    let img = capture(ctx).await?;
    let img = screen::resize(&img, s.model.0, s.model.1)?;
    let png = screen::png(&img)?;
    let text = format!("{note}Screenshot, {}x{} pixels.", s.model.0, s.model.1);
    Ok(with_image(text, &png, s))
}

fn with_image(text: String, png: &[u8], s: &Scaling) -> ToolOutput {
    ToolOutput::ok(text)
        .with_image(crate::Image {
            media_type: "image/png".into(),
            data: base64::engine::general_purpose::STANDARD.encode(png),
        })
        .with_structured(json!({
            "screen": [s.screen.0, s.screen.1],
            "scaled_to": [s.model.0, s.model.1],
        }))
}

/// `xdotool` arguments that hold `mods` (e.g. "ctrl+shift") down around
/// `inner`.
fn with_modifiers(mods: Option<&str>, inner: Vec<String>) -> Vec<String> {
    let Some(m) = mods.map(str::trim).filter(|m| !m.is_empty()) else {
        return inner;
    };
    let mut v = vec!["keydown".to_string(), m.to_string()];
    v.extend(inner);
    v.extend(["keyup".to_string(), m.to_string()]);
    v
}

fn point(s: &Scaling, p: Option<[i64; 2]>, what: &str) -> Result<(u32, u32), String> {
    let [x, y] = p.ok_or_else(|| format!("`{what}` needs `coordinate`: [x, y]"))?;
    s.to_screen(x, y)
}

/// No `--sync`: it waits for a motion event, which a move to where the
/// pointer already is never makes (xdotool gives up after ~15 s). The X
/// server takes one client's requests in order, so a click sent after the
/// move lands where the move put the pointer.
fn move_to((x, y): (u32, u32)) -> Vec<String> {
    vec!["mousemove".into(), x.to_string(), y.to_string()]
}

/// Characters typed per xdotool run: long texts in several, so no one
/// call runs into the exec's timeout and a failure says where it stopped.
const TYPE_CHUNK: usize = 50;

async fn run(ctx: &ToolContext, input: Input) -> Result<ToolOutput, String> {
    let s = geometry(ctx).await?;
    let mut xdo: Vec<String> = Vec::new();
    let mods = input.text.as_deref();
    let click = |button: u8, repeat: u32| {
        let mut v = vec!["click".to_string()];
        if repeat > 1 {
            v.extend([
                "--repeat".into(),
                repeat.to_string(),
                "--delay".into(),
                "80".into(),
            ]);
        }
        v.push(button.to_string());
        v
    };
    match input.action {
        Action::Screenshot => return screenshot(ctx, &s, "").await,
        Action::CursorPosition => {
            let out = sh(
                ctx,
                vec![
                    "xdotool".into(),
                    "getmouselocation".into(),
                    "--shell".into(),
                ],
            )
            .await?;
            let text = String::from_utf8_lossy(&out);
            let get = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.trim().parse::<u32>().ok())
            };
            let (x, y) = match (get("X="), get("Y=")) {
                (Some(x), Some(y)) => s.to_model(x, y),
                _ => return Err(format!("unexpected mouse location {text:?}")),
            };
            return Ok(ToolOutput::ok(format!("The mouse is at ({x}, {y}).")));
        }
        Action::Zoom => {
            let [x0, y0, x1, y1] = input
                .region
                .ok_or("`zoom` needs `region`: [x0, y0, x1, y1]")?;
            if x1 <= x0 || y1 <= y0 {
                return Err("`region` must have x1 > x0 and y1 > y0".into());
            }
            let (sx0, sy0) = s.to_screen(x0, y0)?;
            // The far corner may be the screen's edge itself.
            let (sx1, sy1) = s.to_screen(x1 - 1, y1 - 1)?;
            let img = capture(ctx).await?;
            let part = screen::crop(&img, sx0, sy0, sx1 + 1, sy1 + 1);
            // At the screen's own resolution, shrunk only to fit the model's size.
            let f = (s.model.0 as f64 / part.width as f64)
                .min(s.model.1 as f64 / part.height as f64)
                .min(1.0);
            let (w, h) = (
                ((part.width as f64 * f).round() as u32).max(1),
                ((part.height as f64 * f).round() as u32).max(1),
            );
            let png = screen::png(&screen::resize(&part, w, h)?)?;
            let text = format!("The region ({x0}, {y0})-({x1}, {y1}), {w}x{h} pixels.");
            return Ok(with_image(text, &png, &s));
        }
        Action::Wait => {
            let d = input.duration.unwrap_or(1.0).clamp(0.0, 60.0);
            tokio::time::sleep(Duration::from_secs_f64(d)).await;
            return screenshot(ctx, &s, &format!("Waited {d} s. ")).await;
        }
        Action::Type => {
            let text = input.text.as_deref().ok_or("`type` needs `text`")?;
            let chars: Vec<char> = text.chars().collect();
            for (i, chunk) in chars.chunks(TYPE_CHUNK).enumerate() {
                let part: String = chunk.iter().collect();
                let argv = ["xdotool", "type", "--delay", "12", "--", part.as_str()]
                    .map(String::from)
                    .to_vec();
                sh(ctx, argv).await.map_err(|e| {
                    format!("typing stopped after {} characters: {e}", i * TYPE_CHUNK)
                })?;
            }
            return screenshot(ctx, &s, &format!("Typed {} characters. ", chars.len())).await;
        }
        Action::Key | Action::HoldKey => {
            let keys = input
                .text
                .as_deref()
                .map(str::split_whitespace)
                .map(|k| k.map(String::from).collect::<Vec<_>>())
                .filter(|k| !k.is_empty())
                .ok_or(
                    "`key` and `hold_key` need `text`: key names such as `Return` or `ctrl+s`",
                )?;
            if input.action == Action::Key {
                xdo.extend(["key".into(), "--".into()]);
                xdo.extend(keys);
            } else {
                let d = input.duration.unwrap_or(0.5).clamp(0.0, 10.0);
                xdo.push("keydown".into());
                xdo.extend(keys.iter().cloned());
                xdo.extend(["sleep".into(), format!("{d}"), "keyup".into()]);
                xdo.extend(keys);
            }
        }
        Action::MouseMove => xdo.extend(move_to(point(&s, input.coordinate, "mouse_move")?)),
        Action::LeftClick
        | Action::RightClick
        | Action::MiddleClick
        | Action::DoubleClick
        | Action::TripleClick => {
            if let Some(p) = input.coordinate {
                xdo.extend(move_to(s.to_screen(p[0], p[1])?));
            }
            let (button, repeat) = match input.action {
                Action::RightClick => (3, 1),
                Action::MiddleClick => (2, 1),
                Action::DoubleClick => (1, 2),
                Action::TripleClick => (1, 3),
                _ => (1, 1),
            };
            xdo.extend(with_modifiers(mods, click(button, repeat)));
        }
        Action::LeftMouseDown | Action::LeftMouseUp => {
            if let Some(p) = input.coordinate {
                xdo.extend(move_to(s.to_screen(p[0], p[1])?));
            }
            let verb = if input.action == Action::LeftMouseDown {
                "mousedown"
            } else {
                "mouseup"
            };
            xdo.extend([verb.to_string(), "1".into()]);
        }
        Action::LeftClickDrag => {
            let from = input
                .start_coordinate
                .ok_or("`left_click_drag` needs `start_coordinate`: [x, y]")
                .map_err(String::from)
                .and_then(|[x, y]| s.to_screen(x, y))?;
            let to = point(&s, input.coordinate, "left_click_drag")?;
            xdo.extend(move_to(from));
            xdo.extend(["mousedown".into(), "1".into()]);
            xdo.extend(move_to(to));
            xdo.extend(["mouseup".into(), "1".into()]);
        }
        Action::Scroll => {
            if let Some(p) = input.coordinate {
                xdo.extend(move_to(s.to_screen(p[0], p[1])?));
            }
            let button = match input
                .scroll_direction
                .ok_or("`scroll` needs `scroll_direction`")?
            {
                Direction::Up => 4,
                Direction::Down => 5,
                Direction::Left => 6,
                Direction::Right => 7,
            };
            let amount = input.scroll_amount.unwrap_or(3).clamp(1, 50);
            xdo.extend(with_modifiers(mods, click(button, amount)));
        }
    }
    let mut argv = vec!["xdotool".to_string()];
    argv.extend(xdo);
    sh(ctx, argv).await?;
    // Let the screen catch up before showing it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    screenshot(ctx, &s, "Done. ").await
}
