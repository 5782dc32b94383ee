//! The files API against a job that races it: the job's sandbox exchanges
//! a directory with a link to another tenant's workspace
//! (`renameat2(RENAME_EXCHANGE)`, as fast as it can; the data directory's
//! layout is no secret) while its tenant lists and reads through both
//! names thousands of times. Nothing of the other tenant's may come back.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use cordon_testkit::race::Race;

/// In the other tenant's file names; its file holds [`CONTENT`].
const MARKER: &str = "HOSTMARKER";
const CONTENT: &str = "other-tenant-secret";

/// Makes `d/inner/file.txt` and `l -> ../../{other}/workspace`, for
/// [`exchange_racer`] to swap.
fn setup(other: &str) -> String {
    format!(
        r#"os.makedirs("d/inner", exist_ok=True)
open("d/inner/file.txt", "w").write("own text\n")
os.symlink("../../{other}/workspace", "l")"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_api_never_follows_a_directory_swapped_for_a_link() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let other = s.token("other").await;
    let theirs = s
        .submit(
            &other,
            shell(&format!(
                "mkdir {MARKER}-dir && echo {CONTENT} > {MARKER}.txt && echo {CONTENT} > {MARKER}-dir/{MARKER}.txt"
            )),
        )
        .await;
    assert_eq!(s.wait(&other, &theirs).await["state"], "succeeded");

    let t = s.token("racer").await;
    let racer = s
        .submit(
            &t,
            serde_json::json!({
                "kind": "python",
                "code": exchange_racer(&setup(&theirs)),
            }),
        )
        .await;
    s.wait_running(&t, &racer).await;
    let ws = s.dir.join(format!("data/jobs/{racer}/workspace"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while ws.join("l").symlink_metadata().is_err() {
        assert!(Instant::now() < deadline, "the racer never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The link's target is the other tenant's workspace, as the host sees it.
    let target = ws.join(format!("../../{theirs}/workspace/{MARKER}.txt"));
    assert_eq!(std::fs::read_to_string(target).unwrap().trim(), CONTENT);

    let get = |path: String| {
        let url = s.url(&format!("/v1/jobs/{racer}/files{path}"));
        let req = s.client.get(url).bearer_auth(&t);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let listings = ["", "/d", "/l", "/d/inner", "/l/inner"];
    let files = [
        format!("/d/{MARKER}.txt"),
        format!("/l/{MARKER}.txt"),
        format!("/d/{MARKER}-dir/{MARKER}.txt"),
        "/d/inner/file.txt".to_string(),
        "/l/inner/file.txt".to_string(),
    ];
    // 50 s on an idle machine; a loaded one gets longer for its tries.
    let race = Race::start(5000, Duration::from_secs(50), Duration::from_secs(150));
    let (mut tries, mut refused) = (0usize, 0usize);
    for _ in 0..1000 {
        for path in listings.iter().map(|p| p.to_string()) {
            tries += 1;
            let (status, body) = get(path.clone()).await;
            assert!(
                !body.contains(MARKER),
                "try {tries}: listing {path} showed the other tenant's files: {body}"
            );
            assert!(status < 500, "try {tries}: {path}: {status} {body}");
            refused += usize::from(status != 200);
        }
        for path in &files {
            tries += 1;
            let (status, body) = get(path.clone()).await;
            assert!(
                !body.contains(CONTENT),
                "try {tries}: {path} read the other tenant's file"
            );
            assert!(status < 500, "try {tries}: {path}: {status} {body}");
            refused += usize::from(status != 200);
        }
        if race.done(tries) {
            break;
        }
    }
    let elapsed = race.elapsed();
    std::fs::write(ws.join("stop"), "").unwrap();
    let job = s.wait(&t, &racer).await;
    let swaps = job["stdout"].as_str().unwrap_or("").trim().to_string();
    eprintln!("{tries} requests ({refused} refused) in {elapsed:?} against {swaps} swaps");
    assert_eq!(job["state"], "succeeded", "{job}");
    race.assert_convincing(tries, "requests");
}
