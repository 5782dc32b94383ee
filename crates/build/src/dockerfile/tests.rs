//! The parser's tests: what Docker builds is read, what cordon does not
//! build is refused by line.

use super::*;

fn parsed(text: &str) -> Dockerfile {
    match parse(text) {
        Ok(d) => d,
        Err(e) => panic!("{text:?} refused: {e}"),
    }
}

/// The first stage's ops.
fn ops(text: &str) -> Vec<Op> {
    parsed(text).stages[0]
        .steps
        .iter()
        .map(|s| s.op.clone())
        .collect()
}

fn refused(text: &str) -> String {
    match parse(text) {
        Ok(d) => panic!("{text:?} parsed: {d:?}"),
        Err(e) => e.to_string(),
    }
}

fn shell(s: &str) -> Op {
    Op::Run(Command::Shell(s.into()))
}

fn exec(args: &[&str]) -> Command {
    Command::Exec(args.iter().map(|s| s.to_string()).collect())
}

#[test]
fn a_simple_dockerfile() {
    let d = parsed("FROM alpine:3.20\nRUN echo hi\nCMD [\"sh\"]\n");
    assert_eq!(d.escape, '\\');
    assert!(d.global_args.is_empty());
    assert_eq!(d.stages.len(), 1);
    let stage = &d.stages[0];
    assert_eq!(
        (stage.line, stage.image.as_str(), stage.name.as_deref()),
        (1, "alpine:3.20", None)
    );
    assert_eq!(
        stage.steps,
        [
            Step {
                line: 2,
                text: "RUN echo hi".into(),
                op: shell("echo hi")
            },
            Step {
                line: 3,
                text: "CMD [\"sh\"]".into(),
                op: Op::Cmd(exec(&["sh"]))
            },
        ]
    );
}

#[test]
fn continuation_lines_join_keeping_whitespace_in_the_command() {
    let d = parsed(
        "FROM a\nRUN apt-get update && \\\n    apt-get install -y \\\n      curl\nUSER me\n",
    );
    let steps = &d.stages[0].steps;
    assert_eq!(
        steps[0].op,
        shell("apt-get update &&     apt-get install -y       curl")
    );
    assert_eq!(
        steps[0].text,
        "RUN apt-get update && apt-get install -y curl"
    );
    assert_eq!(steps[0].line, 2);
    assert_eq!((steps[1].line, &steps[1].op), (5, &Op::User("me".into())));
}

#[test]
fn comments_and_blank_lines_inside_a_continuation_are_dropped() {
    let text = "FROM a\nRUN a \\\n# a comment \\\n  \n   # another\n    b\nUSER x\n";
    let d = parsed(text);
    let steps = &d.stages[0].steps;
    assert_eq!(steps[0].op, shell("a     b"));
    assert_eq!(steps[0].text, "RUN a b");
    assert_eq!(steps[1].line, 7);
}

#[test]
fn an_escape_followed_by_spaces_still_continues() {
    assert_eq!(ops("FROM a\nRUN a \\  \n b\n"), [shell("a  b")]);
}

#[test]
fn crlf_line_endings() {
    let d = parsed("FROM a\r\nRUN a \\\r\n  b\r\nUSER x\r\n");
    let steps = &d.stages[0].steps;
    assert_eq!(steps[0].op, shell("a   b"));
    assert_eq!(
        steps[1],
        Step {
            line: 4,
            text: "USER x".into(),
            op: Op::User("x".into())
        }
    );
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let d = parsed("\u{feff}FROM a\nRUN b\n");
    assert_eq!(
        d.stages[0].steps[0],
        Step {
            line: 2,
            text: "RUN b".into(),
            op: shell("b")
        }
    );
}

#[test]
fn the_backtick_escape_directive() {
    let text = "# escape=`\nFROM mcr.microsoft.com/windows\nRUN dir c:\\ `\n  && echo hi\nWORKDIR c:\\x\nRUN echo \\\nUSER a\n";
    let d = parsed(text);
    assert_eq!(d.escape, '`');
    let steps = &d.stages[0].steps;
    assert_eq!(steps[0].op, shell("dir c:\\   && echo hi"));
    assert_eq!(steps[0].line, 3);
    assert_eq!(steps[1].op, Op::Workdir("c:\\x".into()));
    // A backslash ends no line under the backtick.
    assert_eq!(steps[2].op, shell("echo \\"));
    assert_eq!(
        steps[3],
        Step {
            line: 7,
            text: "USER a".into(),
            op: Op::User("a".into())
        }
    );
}

#[test]
fn the_escape_directive_among_others() {
    let d = parsed("# syntax=docker/dockerfile:1\n# escape=`\n\nFROM a\nRUN x `\n y\n");
    assert_eq!(d.escape, '`');
    assert_eq!(d.stages[0].steps[0].op, shell("x  y"));
    // After the first instruction a directive is a comment.
    let d = parsed("FROM a\n# escape=`\nRUN x \\\n y\n");
    assert_eq!(d.escape, '\\');
    assert_eq!(d.stages[0].steps[0].op, shell("x  y"));
}

#[test]
fn exec_forms_are_json() {
    let text = "FROM a\nRUN [\"/bin/sh\", \"-c\", \"echo \\\"hi\\\" $HOME\"]\nENTRYPOINT [\"/init\"]\nCMD [\"a\", \"b c\"]\nCMD []\n";
    assert_eq!(
        ops(text),
        [
            Op::Run(exec(&["/bin/sh", "-c", "echo \"hi\" $HOME"])),
            Op::Entrypoint(exec(&["/init"])),
            Op::Cmd(exec(&["a", "b c"])),
            Op::Cmd(exec(&[])),
        ]
    );
}

#[test]
fn exec_form_across_lines() {
    assert_eq!(
        ops("FROM a\nRUN [\"a\", \\\n  \"b\"]\n"),
        [Op::Run(exec(&["a", "b"]))]
    );
}

#[test]
fn shell_forms_and_json_that_is_not() {
    let text = "FROM a\nCMD echo $HOME\nENTRYPOINT exec /init \\\n  --flag\nCMD [oops]\nRUN [ -e /x ] || true\n";
    assert_eq!(
        ops(text),
        [
            Op::Cmd(Command::Shell("echo $HOME".into())),
            Op::Entrypoint(Command::Shell("exec /init   --flag".into())),
            Op::Cmd(Command::Shell("[oops]".into())),
            shell("[ -e /x ] || true"),
        ]
    );
}

#[test]
fn an_empty_run_or_cmd_is_refused() {
    assert_eq!(refused("FROM a\nRUN\n"), "line 2: RUN needs a command");
    assert_eq!(refused("FROM a\nCMD\n"), "line 2: CMD needs a command");
}

#[test]
fn multi_stage_with_names_lowercased() {
    let text = "FROM golang:1.22 AS Build\nRUN go build\n\nfrom scratch as Final\nCOPY --from=build /out /app\n";
    let d = parsed(text);
    assert_eq!(d.stages.len(), 2);
    assert_eq!(d.stages[0].name.as_deref(), Some("build"));
    assert_eq!(
        (d.stages[1].line, d.stages[1].image.as_str()),
        (4, "scratch")
    );
    assert_eq!(d.stages[1].name.as_deref(), Some("final"));
    assert_eq!(
        d.stages[1].steps[0].op,
        Op::Copy(Copy {
            add: false,
            from: Some("build".into()),
            chown: None,
            chmod: None,
            sources: vec!["/out".into()],
            dest: "/app".into(),
        })
    );
}

#[test]
fn stage_names_are_unique_whatever_their_case() {
    assert_eq!(
        refused("FROM a AS x\nRUN b\nFROM c AS X\n"),
        "line 3: stage name 'x' is already used by the stage on line 1"
    );
    assert!(refused("FROM a AS x\nFROM c AS x\n").starts_with("line 2: "));
}

#[test]
fn stage_names_follow_dockers_rule() {
    assert!(refused("FROM a AS 1x\n").starts_with("line 1: stage name '1x' is not valid"));
    assert!(refused("FROM a AS b$c\n").starts_with("line 1: stage name"));
    assert_eq!(
        parsed("FROM a AS b-c_d.e1\n").stages[0].name.as_deref(),
        Some("b-c_d.e1")
    );
}

#[test]
fn global_args_and_the_image_as_written() {
    let d =
        parsed("# a comment\nARG VERSION=1.0\nARG OTHER\nFROM alpine:${VERSION}\nARG VERSION\n");
    assert_eq!(
        d.global_args,
        [
            Step {
                line: 2,
                text: "ARG VERSION=1.0".into(),
                op: Op::Arg("VERSION=1.0".into())
            },
            Step {
                line: 3,
                text: "ARG OTHER".into(),
                op: Op::Arg("OTHER".into())
            },
        ]
    );
    assert_eq!(d.stages[0].image, "alpine:${VERSION}");
    assert_eq!(d.stages[0].steps[0].op, Op::Arg("VERSION".into()));
}

#[test]
fn raw_arguments_of_env_label_workdir_user_expose() {
    let text = "FROM a\nENV a=1 b=\"two  words\"\nENV PATH /x:$PATH\nLABEL \"com.example\"=\"my app\" \\\n  v=1\nWORKDIR /src/$APP\nUSER app:app\nEXPOSE 80 443/tcp\n";
    let d = parsed(text);
    let steps = &d.stages[0].steps;
    let ops: Vec<&Op> = steps.iter().map(|s| &s.op).collect();
    assert_eq!(
        ops,
        [
            &Op::Env("a=1 b=\"two  words\"".into()),
            &Op::Env("PATH /x:$PATH".into()),
            &Op::Label("\"com.example\"=\"my app\"   v=1".into()),
            &Op::Workdir("/src/$APP".into()),
            &Op::User("app:app".into()),
            &Op::Expose(vec!["80".into(), "443/tcp".into()]),
        ]
    );
    assert_eq!(steps[0].text, "ENV a=1 b=\"two words\"");
    assert_eq!(steps[2].text, "LABEL \"com.example\"=\"my app\" v=1");
    assert_eq!(steps[3].line, 6);
}

#[test]
fn copy_and_add_with_their_flags() {
    let text = "FROM a\nCOPY --chown=1:2 --chmod=644 a b* /dst/\nADD --chown=app x.tar /opt/\nCOPY [\"a b\", \"/c d/\"]\n";
    assert_eq!(
        ops(text),
        [
            Op::Copy(Copy {
                add: false,
                from: None,
                chown: Some("1:2".into()),
                chmod: Some("644".into()),
                sources: vec!["a".into(), "b*".into()],
                dest: "/dst/".into(),
            }),
            Op::Copy(Copy {
                add: true,
                from: None,
                chown: Some("app".into()),
                chmod: None,
                sources: vec!["x.tar".into()],
                dest: "/opt/".into(),
            }),
            Op::Copy(Copy {
                add: false,
                from: None,
                chown: None,
                chmod: None,
                sources: vec!["a b".into()],
                dest: "/c d/".into(),
            }),
        ]
    );
}

#[test]
fn instructions_cordon_does_not_build_are_refused_by_line() {
    for name in [
        "HEALTHCHECK CMD true",
        "ONBUILD RUN x",
        "SHELL [\"bash\", \"-c\"]",
        "STOPSIGNAL SIGKILL",
        "VOLUME /data",
        "MAINTAINER me",
    ] {
        let keyword = name.split(' ').next().unwrap();
        let text = format!("# top\nFROM a\n\nRUN x\n\n# c\n{name}\nRUN y\n");
        assert_eq!(
            refused(&text),
            format!("line 7: {keyword} is not supported by cordon image build")
        );
    }
    // Lowercase too.
    assert_eq!(
        refused("FROM a\nvolume /x\n"),
        "line 2: VOLUME is not supported by cordon image build"
    );
}

#[test]
fn run_flags_are_refused_by_name() {
    let text = "FROM a\nRUN x\n\nRUN --mount=type=cache,target=/root/.cache make\n";
    assert_eq!(refused(text), "line 4: RUN --mount is not supported");
    assert_eq!(
        refused("FROM a\nRUN --network=none x\n"),
        "line 2: RUN --network is not supported"
    );
    assert_eq!(
        refused("FROM a\nRUN --security=insecure x\n"),
        "line 2: RUN --security is not supported"
    );
    assert_eq!(
        refused("FROM a\nRUN \\\n  --mount=type=ssh x\n"),
        "line 2: RUN --mount is not supported"
    );
}

#[test]
fn copy_and_add_flags_outside_the_few_are_refused() {
    assert_eq!(
        refused("FROM a\nCOPY --link a b\n"),
        "line 2: COPY --link is not supported"
    );
    assert_eq!(
        refused("FROM a\nCOPY --parents a b\n"),
        "line 2: COPY --parents is not supported"
    );
    assert_eq!(
        refused("FROM a\nADD --from=x a b\n"),
        "line 2: ADD --from is not supported"
    );
    assert_eq!(
        refused("FROM a\nADD --checksum=sha256:00 a b\n"),
        "line 2: ADD --checksum is not supported"
    );
    assert_eq!(
        refused("FROM a\nCOPY --from a b\n"),
        "line 2: COPY --from needs a value"
    );
    assert_eq!(
        refused("FROM a\nCOPY --chown= a b\n"),
        "line 2: COPY --chown needs a value"
    );
    assert_eq!(
        refused("FROM a\nCOPY --from=x --from=y a b\n"),
        "line 2: COPY --from is given twice"
    );
}

#[test]
fn from_platform_only_this_hosts() {
    let host = host_platform().unwrap();
    let d = parsed(&format!("FROM --platform={host} a AS b\n"));
    assert_eq!(
        (d.stages[0].image.as_str(), d.stages[0].name.as_deref()),
        ("a", Some("b"))
    );
    parsed("FROM --platform=$BUILDPLATFORM a\nFROM --platform=${TARGETPLATFORM} b\n");
    let other = if host == "linux/amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    assert_eq!(
        refused(&format!("FROM a\nFROM --platform={other} b\n")),
        format!(
            "line 2: FROM --platform={other} is not supported: cordon builds only for this host's platform, {host}"
        )
    );
    assert_eq!(
        refused("FROM --squash a\n"),
        "line 1: FROM --squash is not supported"
    );
}

#[test]
fn add_from_a_url_is_refused() {
    assert_eq!(
        refused("FROM a\n\nADD https://example.com/x.tar.gz /x/\n"),
        "line 3: ADD https://example.com/x.tar.gz is not supported: fetch it in a RUN with --allow"
    );
    assert!(refused("FROM a\nADD a HTTP://h/b /x/\n").starts_with("line 2: ADD HTTP://h/b"));
    assert!(
        refused("FROM a\nADD git@github.com:o/r.git /r\n")
            .starts_with("line 2: ADD git@github.com")
    );
    assert!(is_remote("git://h/r") && is_remote("http://h") && !is_remote("./http"));
}

#[test]
fn here_documents_are_refused() {
    let text = "FROM a\nRUN <<EOF\necho hi\nEOF\n";
    assert_eq!(
        refused(text),
        "line 2: here-documents in RUN are not supported"
    );
    // Not first in the command: the crate would read the body as instructions.
    let text = "FROM a\nRUN cat <<-'EOF' > /x\nRUN not an instruction\nEOF\n";
    assert_eq!(
        refused(text),
        "line 2: here-documents in RUN are not supported"
    );
    assert_eq!(
        refused("FROM a\nRUN x\nRUN python3 2<<EOF\nprint(1)\nEOF\n"),
        "line 3: here-documents in RUN are not supported"
    );
    assert_eq!(
        refused("FROM a\nCOPY <<EOF /x\nhi\nEOF\n"),
        "line 2: here-documents in COPY are not supported"
    );
    assert_eq!(
        refused("FROM a\nADD <<EOF /x\nhi\nEOF\n"),
        "line 2: here-documents in ADD are not supported"
    );
}

#[test]
fn shifts_and_here_strings_are_not_here_documents() {
    let text = "FROM a\nRUN echo $((1<<2))\nRUN cat <<< hi\nRUN echo \"<<EOF\" '<<EOF' \\<<EOF\n";
    assert_eq!(
        ops(text),
        [
            shell("echo $((1<<2))"),
            shell("cat <<< hi"),
            shell("echo \"<<EOF\" '<<EOF' \\<<EOF")
        ]
    );
}

#[test]
fn no_from_is_refused() {
    assert_eq!(
        refused(""),
        "line 0: expected at least one FROM instruction"
    );
    assert_eq!(
        refused("# only\nARG x\n"),
        "line 0: expected at least one FROM instruction"
    );
}

#[test]
fn only_arg_may_come_before_from() {
    assert_eq!(
        refused("RUN x\nFROM a\n"),
        "line 1: RUN comes before the first FROM (only ARG may)"
    );
    assert_eq!(
        refused("# c\n\nARG a\nenv a=b\nFROM x\n"),
        "line 4: ENV comes before the first FROM (only ARG may)"
    );
}

#[test]
fn the_crates_errors_keep_their_line() {
    assert_eq!(
        refused("FROM a\n\nFOO bar\n"),
        "line 3: unknown instruction 'FOO'"
    );
    assert_eq!(
        refused("FROM a\nCOPY onlyone\n"),
        "line 2: COPY instruction requires at least two arguments"
    );
    assert!(refused("# escape=x\nFROM a\n").starts_with("line 1: invalid escape"));
}

#[test]
fn line_of_counts_newlines_before() {
    let text = "a\nbc\n\nd";
    assert_eq!(line_of(text, 0), 1);
    assert_eq!(line_of(text, 1), 1);
    assert_eq!(line_of(text, 2), 2);
    assert_eq!(line_of(text, 5), 3);
    assert_eq!(line_of(text, 6), 4);
    assert_eq!(line_of(text, 100), 4);
}

#[test]
fn label_pairs_with_quotes() {
    let owned = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let vars = |_: &str| None;
    let got = crate::expand::pairs(
        "\"com.example.name\"=\"my app\" version=1.0 desc=\"say \\\"hi\\\"\" 'single'='a  b'",
        '\\',
        &vars,
    )
    .unwrap();
    assert_eq!(
        got,
        owned(&[
            ("com.example.name", "my app"),
            ("version", "1.0"),
            ("desc", "say \"hi\""),
            ("single", "a  b")
        ])
    );
    // The raw text of a LABEL across lines, as parse gives it.
    let d = parsed("FROM a\nLABEL a=1 \\\n  b=\"x y\"\n");
    let Op::Label(raw) = &d.stages[0].steps[0].op else {
        panic!()
    };
    assert_eq!(
        crate::expand::pairs(raw, d.escape, &vars).unwrap(),
        owned(&[("a", "1"), ("b", "x y")])
    );
}
