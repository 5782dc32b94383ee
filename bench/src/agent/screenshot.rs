//! Screenshots of a sandbox's display: cordon's `computer` tool (xwd in
//! the sandbox, decoded, scaled and PNG-encoded in-process) next to the
//! approach of Anthropic's computer-use reference implementation (a
//! screenshot program writing a PNG, then ImageMagick's `convert` to scale
//! it, then base64), both inside the same kind of sandbox, alternating.
//!
//! Measured: the time from creating a sandbox with a display to the first
//! screenshot in hand, and the latency of a screenshot in a warm session.
//! The screen is 1280x960, so both scale to XGA (1024x768).

use std::time::{Duration, Instant};

use cordon_sandbox::{Display, ExecRequest, Sandbox, SandboxConfig};
use cordon_tools::{Tool, ToolContext};
use serde_json::json;

use crate::Args;
use crate::stats::{Json, Summary, ms};

const SCREEN: Display = Display {
    width: 1280,
    height: 960,
};

/// The reference's pipeline, as its screenshot function runs it.
const REFERENCE: &str = "scrot -o /tmp/shot.png >/dev/null 2>&1 && \
    /usr/bin/convert /tmp/shot.png -resize 1024x768! /tmp/shot-scaled.png && \
    base64 -w0 /tmp/shot-scaled.png";

async fn sandbox(workspace: &std::path::Path) -> Result<Sandbox, String> {
    let mut c = SandboxConfig::new(workspace);
    c.display = Some(SCREEN);
    Sandbox::create(c)
        .await
        .map_err(|e| format!("cannot create a sandbox with a display: {e}"))
}

async fn ours(ctx: &ToolContext) -> Result<usize, String> {
    let out = cordon_tools::computer::Computer
        .call(ctx, json!({"action": "screenshot"}))
        .await;
    if out.is_error {
        return Err(out.text);
    }
    Ok(out.images.first().map_or(0, |i| i.data.len()))
}

async fn reference(sb: &Sandbox) -> Result<usize, String> {
    let out = sb
        .exec(
            ExecRequest::shell(REFERENCE)
                .output_limit(64 << 20)
                .timeout(Duration::from_secs(60)),
        )
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "the reference pipeline failed (needs scrot and imagemagick): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out.stdout.len())
}

pub async fn run(args: &Args, workspace: &std::path::Path) -> Result<Json, String> {
    let cold_rounds = args.num("cold", 5)?;
    let warm_rounds = args.num("shots", 30)?;
    let (mut cold_ours, mut cold_ref) = (Vec::new(), Vec::new());
    for _ in 0..cold_rounds {
        let start = Instant::now();
        let sb = sandbox(workspace).await?;
        let ctx = ToolContext::new(sb.clone(), workspace);
        ours(&ctx).await?;
        cold_ours.push(start.elapsed());
        sb.close().await;

        let start = Instant::now();
        let sb = sandbox(workspace).await?;
        reference(&sb).await?;
        cold_ref.push(start.elapsed());
        sb.close().await;
    }

    let sb = sandbox(workspace).await?;
    let ctx = ToolContext::new(sb.clone(), workspace);
    // Something on the screen, as a desktop would have.
    sb.exec(ExecRequest::shell(
        "xeyes -geometry 500x500+40+40 >/dev/null 2>&1 & xlogo -geometry 400x300+700+100 >/dev/null 2>&1 & \
         xclock -update 1 -geometry 300x300+700+500 >/dev/null 2>&1 & sleep 1",
    ))
    .await
    .map_err(|e| e.to_string())?;
    // One of each first: fonts, caches and the pages of both programs.
    let our_bytes = ours(&ctx).await?;
    let ref_bytes = reference(&sb).await?;
    let (mut warm_ours, mut warm_ref) = (Vec::new(), Vec::new());
    for _ in 0..warm_rounds {
        let t = Instant::now();
        ours(&ctx).await?;
        warm_ours.push(t.elapsed());
        let t = Instant::now();
        reference(&sb).await?;
        warm_ref.push(t.elapsed());
    }
    sb.close().await;

    let (co, cr) = (Summary::of(&cold_ours), Summary::of(&cold_ref));
    let (wo, wr) = (Summary::of(&warm_ours), Summary::of(&warm_ref));
    println!("Screenshots of a 1280x960 sandbox display, scaled to 1024x768 PNG (base64)");
    println!(
        "  sandbox start to first screenshot ({cold_rounds} rounds): cordon p50 {} ms, reference p50 {} ms, ratio {:.2}",
        ms(co.p50),
        ms(cr.p50),
        co.p50 / cr.p50
    );
    println!(
        "  warm screenshot ({warm_rounds} rounds): cordon p50 {} ms (p90 {}), reference p50 {} ms (p90 {}), ratio {:.2}",
        ms(wo.p50),
        ms(wo.p90),
        ms(wr.p50),
        ms(wr.p90),
        wo.p50 / wr.p50
    );
    println!("  base64 size: cordon {our_bytes} bytes, reference {ref_bytes} bytes");
    Ok(Json::obj([
        ("cold_cordon", co.json()),
        ("cold_reference", cr.json()),
        ("cold_ratio_p50", Json::Num(co.p50 / cr.p50)),
        ("warm_cordon", wo.json()),
        ("warm_reference", wr.json()),
        ("warm_ratio_p50", Json::Num(wo.p50 / wr.p50)),
        ("bytes_cordon", Json::Num(our_bytes as f64)),
        ("bytes_reference", Json::Num(ref_bytes as f64)),
    ]))
}
