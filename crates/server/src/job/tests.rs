use serde_json::{Value, json};

use super::*;

fn parse(v: Value) -> Result<Job, String> {
    JobRequest::from_json(v)?.check(&Bounds::default())
}

fn preview(v: Value) -> String {
    JobRequest::from_json(v).unwrap().preview()
}

#[test]
fn a_preview_is_one_clean_line() {
    assert_eq!(
        preview(json!({"kind": "shell", "command": "ls -la"})),
        "ls -la"
    );
    assert_eq!(
        preview(json!({"kind": "python", "code": "\nimport os\nprint(os.getcwd())\n"})),
        "import os…"
    );
    assert_eq!(
        preview(json!({"kind": "agent", "prompt": "fix \u{1b}[2Jthe tests"})),
        "fix  [2Jthe tests"
    );
    let long = "x".repeat(500);
    assert_eq!(
        preview(json!({"kind": "shell", "command": long}))
            .chars()
            .count(),
        PREVIEW_CHARS + 1
    );
    assert_eq!(
        preview(
            json!({"kind": "steps", "steps": [{"tool": "shell", "command": "make"}, {"tool": "read_file", "path": "out"}]})
        ),
        "2 steps: shell make"
    );
    assert_eq!(
        preview(json!({"kind": "gui", "steps": [{"tool": "computer", "action": "screenshot"}]})),
        "1 step: computer screenshot"
    );
}

/// A job is stored as its request with every default filled in; read back,
/// it is the same job, and stored again, the same bytes.
#[test]
fn every_kind_round_trips_through_its_stored_form() {
    for body in [
        json!({"kind": "shell", "command": "echo hi", "timeout_secs": 5}),
        json!({"kind": "python", "code": "print(1)", "memory": "256M", "network": "loopback"}),
        json!({"kind": "shell", "command": "ls", "disk": "100M"}),
        json!({"kind": "shell", "command": "ls", "disk": 104857600}),
        json!({"kind": "typescript", "code": "let x: number = 1"}),
        json!({"kind": "javascript", "code": "console.log(1)"}),
        json!({"steps": [
            {"tool": "shell", "command": "ls"},
            {"tool": "python", "code": "print(2)"},
            {"kind": "write_file", "path": "a.txt", "content": "x"},
            {"tool": "read_file", "path": "a.txt"},
        ]}),
        json!({"kind": "agent", "prompt": "do it", "max_steps": 5}),
        json!({"kind": "gui", "display": "1024x768", "steps": [
            {"tool": "shell", "command": "xeyes &"},
            {"tool": "computer", "action": "left_click", "coordinate": [10, 20], "text": "shift"},
        ]}),
        json!({"kind": "gui", "steps": [{"tool": "computer", "action": "screenshot"}]}),
        json!({"kind": "agent", "prompt": "use the screen", "display": "800x600"}),
        json!({"kind": "shell", "command": "uname -r", "backend": "microvm"}),
        json!({"kind": "shell", "command": "curl x", "allow": ["example.com:443"], "allow_private": true}),
        json!({"kind": "shell", "command": "curl x", "network": "allow"}),
    ] {
        let job = parse(body.clone()).unwrap_or_else(|e| panic!("{body}: {e}"));
        let stored = serde_json::to_string(&job.request()).unwrap();
        let read: JobRequest = serde_json::from_str(&stored).unwrap();
        let again = read.check(&Bounds::default()).unwrap();
        assert_eq!(again, job, "{body}");
        assert_eq!(serde_json::to_string(&again.request()).unwrap(), stored);
    }
}

#[test]
fn defaults_are_filled_in_and_the_kind_follows_the_screen() {
    let job = parse(json!({"kind": "gui", "steps": [{"tool": "shell", "command": "ls"}]})).unwrap();
    assert_eq!(job.spec.display(), Some(DEFAULT_DISPLAY));
    assert_eq!(job.spec.kind(), JobKind::Gui);
    let stored = serde_json::to_value(job.request()).unwrap();
    assert_eq!(stored["display"], "1280x800");
    assert_eq!(stored["timeout_secs"], 300);
    assert_eq!(stored["memory"], 512 * 1024 * 1024);
    assert_eq!(stored["network"], "off");
    assert_eq!(
        stored["steps"][0],
        json!({"tool": "shell", "command": "ls"})
    );
    let job = parse(json!({"kind": "shell", "command": "ls", "allow": ["@python"]})).unwrap();
    assert_eq!(job.options.network, NetworkMode::Allow);
    assert_eq!(job.options.egress.unwrap().allow, vec!["@python"]);
}

#[test]
fn mistakes_are_named_by_their_path() {
    let cases = [
        (json!([1]), "a job must be a JSON object, not an array"),
        (json!({}), "a job needs `kind`"),
        (json!({"kind": 3}), "`kind`: invalid type: integer `3`"),
        (
            json!({"kind": "cobol", "code": "x"}),
            "`kind`: unknown variant `cobol`, expected one of `shell`",
        ),
        (json!({"kind": "shell"}), "missing field `command`"),
        (
            json!({"kind": "shell", "command": 5}),
            "`command`: invalid type: integer `5`, expected a string",
        ),
        (
            json!({"kind": "shell", "comand": "ls"}),
            "unknown field `comand`, expected one of `command`",
        ),
        (
            json!({"kind": "shell", "command": " "}),
            "`command`: must not be empty",
        ),
        (
            json!({"kind": "agent", "prompt": "x", "display": 1280}),
            "`display`: invalid type: integer `1280`, expected a string",
        ),
        (
            json!({"kind": "agent", "prompt": "x", "display": "huge"}),
            "`display`: expected WIDTHxHEIGHT",
        ),
        (
            json!({"kind": "shell", "command": "ls", "display": "800x600"}),
            "unknown field `display`",
        ),
        (
            json!({"kind": "shell", "command": "ls", "backend": "docker"}),
            "`backend`: unknown variant `docker`, expected `native` or `microvm`",
        ),
        (
            json!({"kind": "shell", "command": "ls", "timeout_secs": 0}),
            "`timeout_secs` must be a whole number of seconds from 1 to 3600",
        ),
        (
            json!({"kind": "shell", "command": "ls", "timeout_secs": "9"}),
            "`timeout_secs`: invalid type: string \"9\", expected u64",
        ),
        (
            json!({"kind": "shell", "command": "ls", "timeout_secs": -1}),
            "`timeout_secs`: invalid value: integer `-1`, expected u64",
        ),
        (
            json!({"kind": "shell", "command": "ls", "memory": "lots"}),
            "`memory`: ",
        ),
        (
            json!({"kind": "shell", "command": "ls", "memory": "64G"}),
            "`memory` must be from 16M to 4096M",
        ),
        (
            json!({"kind": "shell", "command": "ls", "disk": "64G"}),
            "`disk` (how much the workspace may grow) must be a size from 1M to 8192M",
        ),
        (
            json!({"kind": "shell", "command": "ls", "disk": true}),
            "`disk`: invalid type: boolean `true`, expected a size such as \"512M\"",
        ),
        (
            json!({"kind": "shell", "command": "ls", "network": true}),
            "`network`: invalid type: boolean `true`",
        ),
        // Jobs reach hosts through the broker only.
        (
            json!({"kind": "shell", "command": "ls", "network": "full"}),
            "`network`: jobs and sessions never get the host's network",
        ),
        (
            json!({"kind": "shell", "command": "ls", "network": "wifi"}),
            "`network`: expected \"off\", \"loopback\" or \"allow\", not \"wifi\"",
        ),
        (
            json!({"kind": "shell", "command": "ls", "allow": ["a.example"], "network": "off"}),
            "need `network` \"allow\"",
        ),
        (
            json!({"kind": "shell", "command": "ls", "allow": ["ok.example", "bad host"]}),
            "`allow[1]`: ",
        ),
        (json!({"steps": []}), "`steps` is empty"),
        (
            json!({"steps": {}}),
            "`steps`: invalid type: map, expected a sequence",
        ),
        (
            json!({"steps": [{"tool": "rm"}]}),
            "`steps[0].tool`: unknown variant `rm`",
        ),
        (
            json!({"steps": [{"command": "ls"}]}),
            "`steps[0]`: a step needs `tool`",
        ),
        (
            json!({"steps": [{"tool": "shell", "code": "ls"}]}),
            "`steps[0].code`: unknown field `code`, expected `command`",
        ),
        (
            json!({"steps": [{"tool": "shell", "command": "ls"}, {"tool": "shell", "command": 7}]}),
            "`steps[1].command`: invalid type: integer `7`, expected a string",
        ),
        (
            json!({"steps": [{"tool": "computer", "action": "screenshot"}]}),
            "computer steps need a display",
        ),
        (
            json!({"kind": "gui", "steps": [{"tool": "computer", "action": "dance"}]}),
            "`steps[0]`: invalid computer action: unknown variant `dance`",
        ),
        (
            json!({"kind": "agent", "prompt": "x", "max_steps": 0}),
            "`max_steps` must be a whole number from 1 to 200",
        ),
    ];
    for (body, want) in cases {
        let err = parse(body.clone()).unwrap_err();
        assert!(err.contains(want), "{body}: {err:?} lacks {want:?}");
    }
}
