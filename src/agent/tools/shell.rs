//! `run_terminal_cmd`, run through `shell_stream_args` (the client refuses `shell_args` without
//! a parsing result, and streaming shows output live). The client answers start → stdout /
//! stderr … → exit; the pieces are folded into one `ShellResult`.
//!
//! Long commands behave as in Cursor: `ShellArgs.timeout` (ms) is the block time, and with
//! `TimeoutBehavior::Background` a command still running then moves to the background (the
//! client answers `backgrounded` with its shell id) instead of being killed; the model's
//! `timeout` (seconds) becomes `hard_timeout`, which kills it. `is_background` starts the
//! command through `background_shell_spawn_args` instead. A background shell writes its
//! output to `<terminals_folder>/<shell_id>.txt` on the client; the model reads that file.

use serde_json::{json, Value};

use super::args::Args;
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolContext, ToolError, ToolPlan};
use super::catalog::{SHELL_DEFAULT_BLOCK_MS, SHELL_MAX_TIMEOUT_SECS};
use super::text::cap_middle;
use crate::proto::agent::v1 as pb;
use pb::shell_command_parsing_result::{ExecutableCommand, ExecutableCommandArg, Redirect};
use pb::shell_result::Result as R;
use pb::shell_stream::Event;
use pb::tool_call::Tool;

/// Output kept for the model (head and tail) and for the UI.
const MAX_MODEL_OUTPUT: usize = 30_000;
const MAX_UI_OUTPUT: usize = 100_000;
/// A `timeout` above this many "seconds" was meant as milliseconds (Claude's Bash tool uses ms).
const SECONDS_CEILING: i64 = 3600;

pub(crate) fn plan(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let command = command(a)?;
    let background = a
        .bool_opt(&["is_background", "background", "run_in_background"])?
        .unwrap_or(false);
    let working_directory = a
        .str_opt(&[
            "working_directory",
            "cwd",
            "workdir",
            "working_dir",
            "directory",
            "dir",
        ])?
        .filter(|d| !d.trim().is_empty())
        .map(|d| ctx.resolve_path(&d))
        .unwrap_or_default();
    let description = a
        .str_opt(&["explanation", "description"])?
        .filter(|d| !d.trim().is_empty());
    let parsed = parse(&command);
    let args = pb::ShellArgs {
        working_directory,
        // The block time: past it the client moves the command to the background (Cursor's
        // own long-command behaviour) rather than killing it; `hard_timeout` still kills.
        timeout: if background { 0 } else { block_ms(ctx, a)? },
        // Kept on a background start too, though `BackgroundShellSpawnArgs` has no field to
        // carry it: the result then tells the model it was not applied.
        hard_timeout: hard_timeout_ms(a)?,
        is_background: background,
        tool_call_id: call_id.to_string(),
        simple_commands: parsed.simple_commands,
        has_input_redirect: parsed.input_redirect,
        has_output_redirect: parsed.output_redirect,
        parsing_result: Some(parsed.result),
        timeout_behavior: pb::TimeoutBehavior::Background as i32,
        // Nothing can answer a prompt in the foreground: a command reading stdin sees EOF;
        // interactive programs run with `is_background` and `write_shell_stdin`.
        close_stdin: true,
        description: description.clone(),
        command,
        admin_command_denylist: ctx.command_denylist.clone(),
        ..Default::default()
    };
    let exec = if background {
        ExecArgs::BackgroundShellSpawnArgs(spawn_args(&args))
    } else {
        ExecArgs::ShellStreamArgs(args.clone())
    };
    Ok(ToolPlan::Exec {
        exec,
        tool_call: wrap(
            call_id,
            Tool::ShellToolCall(pb::ShellToolCall {
                args: Some(args),
                result: None,
                description,
            }),
        ),
        access: Access::Exclusive,
    })
}

/// A background start: the command as `background_shell_spawn_args`, with the stdin tool on
/// (the catalogue offers `write_shell_stdin` wherever it offers this command).
fn spawn_args(args: &pb::ShellArgs) -> pb::BackgroundShellSpawnArgs {
    pb::BackgroundShellSpawnArgs {
        command: args.command.clone(),
        working_directory: args.working_directory.clone(),
        tool_call_id: args.tool_call_id.clone(),
        parsing_result: args.parsing_result.clone(),
        enable_write_shell_stdin_tool: true,
        description: args.description.clone(),
        admin_command_denylist: args.admin_command_denylist.clone(),
        ..Default::default()
    }
}

/// The command line: a string, or an argv (`["bash", "-lc", "…"]` unwraps to the script).
fn command(a: &Args) -> Result<String, ToolError> {
    let keys = ["command", "cmd", "script", "commands"];
    let cmd = match a.get(&keys) {
        Some(Value::Array(items)) => {
            let argv: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            let argv = argv.ok_or_else(|| a.error("`command` must be a string"))?;
            match argv.as_slice() {
                [sh, flag, script]
                    if matches!(*sh, "bash" | "sh" | "zsh") && matches!(*flag, "-c" | "-lc") =>
                {
                    (*script).to_string()
                }
                _ => argv.iter().map(|s| quote(s)).collect::<Vec<_>>().join(" "),
            }
        }
        _ => a.str_req(&keys, "string: the command line to run")?,
    };
    if cmd.trim().is_empty() {
        return Err(a.error("`command` must not be empty"));
    }
    Ok(cmd)
}

fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The hard timeout the model asked for, in ms: `timeout` in seconds (or ms when it is too
/// large to be seconds), or `timeout_ms`. None: no hard limit.
fn hard_timeout_ms(a: &Args) -> Result<Option<i32>, ToolError> {
    let ms = if let Some(ms) = a.int_in(&["timeout_ms", "hard_timeout"], 1, i64::MAX)? {
        ms
    } else {
        match a.int_in(&["timeout", "timeout_secs", "timeout_seconds"], 1, i64::MAX)? {
            Some(t) if t > SECONDS_CEILING => t,
            Some(t) => t * 1000,
            None => return Ok(None),
        }
    };
    Ok(Some(clamp_ms(ms)))
}

/// How long a foreground command blocks before moving to the background, in ms.
fn block_ms(ctx: &ToolContext, a: &Args) -> Result<i32, ToolError> {
    let ms = match a.int_in(&["block_until_ms"], 0, i64::MAX)? {
        Some(ms) => ms,
        None => i64::from(ctx.shell_block_ms.unwrap_or(SHELL_DEFAULT_BLOCK_MS)),
    };
    Ok(clamp_ms(ms))
}

fn clamp_ms(ms: i64) -> i32 {
    i32::try_from(ms.min(SHELL_MAX_TIMEOUT_SECS * 1000)).unwrap_or(i32::MAX)
}

struct Parsed {
    simple_commands: Vec<String>,
    input_redirect: bool,
    output_redirect: bool,
    result: pb::ShellCommandParsingResult,
}

#[derive(Default)]
struct Segment {
    text: String,
    words: Vec<String>,
}

/// A small POSIX-ish tokenizer: simple commands split on `;`, `&&`, `||`, `|`, `&` and
/// newlines, words with quotes and escapes resolved, redirections recorded. Good enough for
/// the client's allowlist checks; anything it cannot follow sets `parsing_failed`.
fn parse(command: &str) -> Parsed {
    let chars: Vec<char> = command.chars().collect();
    let mut t = Tokenizer::default();
    let mut i = 0;
    while i < chars.len() {
        i = t.step(&chars, i);
    }
    t.finish()
}

/// The simple commands of a command line as words (quotes and escapes resolved, leading
/// `NAME=value` assignments left out), for checks that match commands by their words; `None`
/// when the tokenizer cannot follow the line (an open quote, a subshell or group).
pub(crate) fn command_words(command: &str) -> Option<Vec<Vec<String>>> {
    let parsed = parse(command);
    if parsed.result.parsing_failed {
        return None;
    }
    let words = parsed.result.executable_commands.into_iter().map(|c| {
        std::iter::once(c.name)
            .chain(c.args.into_iter().map(|a| a.value))
            .collect()
    });
    Some(words.collect())
}

/// The tokenizer's state while it walks a command line.
#[derive(Default)]
struct Tokenizer {
    segs: Vec<Segment>,
    seg: Segment,
    word: String,
    /// A word is under way (it may still be empty: `''`).
    started: bool,
    quote: Option<char>,
    /// A redirection operator and its descriptors, waiting for the target word.
    pending: Option<(String, Vec<u32>)>,
    redirects: Vec<Redirect>,
    substitution: bool,
    failed: bool,
}

impl Tokenizer {
    /// Take the token at `chars[i]`; the index after it.
    fn step(&mut self, chars: &[char], i: usize) -> usize {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if let Some(q) = self.quote {
            return i + 1 + self.quoted(q, c, next);
        }
        let extra = match c {
            '\\' => self.escape(next),
            '\'' | '"' => {
                self.quote = Some(c);
                self.started = true;
                self.seg.text.push(c);
                0
            }
            ' ' | '\t' => {
                self.finish_word();
                self.seg.text.push(c);
                0
            }
            '&' if next == Some('>') => self.both_outputs(chars.get(i + 2) == Some(&'>')),
            ';' | '\n' | '|' | '&' => self.separator(c, next),
            '>' | '<' => self.redirect(c, &chars[i + 1..]),
            '$' if next == Some('(') => {
                self.substitution = true;
                self.word_char(c);
                0
            }
            '`' => {
                self.substitution = true;
                self.word_char(c);
                0
            }
            '(' | ')' | '{' | '}' if !self.started => {
                // Subshells and groups are beyond this tokenizer.
                self.failed = true;
                self.seg.text.push(c);
                0
            }
            _ => {
                self.word_char(c);
                0
            }
        };
        i + 1 + extra
    }

    /// `c` inside quotes `q`; how many characters after it were taken too.
    fn quoted(&mut self, q: char, c: char, next: Option<char>) -> usize {
        self.seg.text.push(c);
        if c == q {
            self.quote = None;
        } else if q == '"' && c == '\\' && next.is_some() {
            self.word.extend(next);
            self.seg.text.extend(next);
            return 1;
        } else {
            self.substitution |= q == '"' && (c == '`' || (c == '$' && next == Some('(')));
            self.word.push(c);
        }
        0
    }

    /// A backslash outside quotes: the next character is literal.
    fn escape(&mut self, next: Option<char>) -> usize {
        self.seg.text.push('\\');
        self.started = true;
        let Some(n) = next else {
            return 0;
        };
        self.word.push(n);
        self.seg.text.push(n);
        1
    }

    fn word_char(&mut self, c: char) {
        self.word.push(c);
        self.started = true;
        self.seg.text.push(c);
    }

    /// `&>` or `&>>`: stdout and stderr to one target.
    fn both_outputs(&mut self, append: bool) -> usize {
        self.finish_word();
        let op = if append { "&>>" } else { "&>" };
        self.seg.text.push_str(op);
        self.pending = Some((op.to_string(), vec![1, 2]));
        op.len() - 1
    }

    /// The end of a simple command: `;`, a newline, `|`, `&` and their doubled forms.
    fn separator(&mut self, c: char, next: Option<char>) -> usize {
        self.finish_word();
        if self.pending.take().is_some() {
            self.failed = true;
        }
        self.segs.push(std::mem::take(&mut self.seg));
        // `&&`, `||`, `;;`, `|&` are one operator.
        usize::from(next == Some(c) || (c == '|' && next == Some('&')))
    }

    /// A redirection starting with `c`; `rest` is what follows it.
    fn redirect(&mut self, c: char, rest: &[char]) -> usize {
        // A word of digits right before the operator is its file descriptor (`2>`).
        let word = &self.word;
        let fds = if self.started && !word.is_empty() && word.chars().all(|d| d.is_ascii_digit()) {
            let fd = word.parse::<u32>().ok();
            self.word.clear();
            self.started = false;
            fd.into_iter().collect()
        } else {
            self.finish_word();
            vec![if c == '<' { 0 } else { 1 }]
        };
        let mut op = c.to_string();
        for n in rest.iter().take_while(|n| "<>&|".contains(**n)).take(2) {
            op.push(*n);
        }
        let extra = op.len() - 1;
        self.seg.text.push_str(&op);
        self.pending = Some((op, fds));
        extra
    }

    /// The word under way is complete: a redirection's target or the command's next word.
    fn finish_word(&mut self) {
        if !self.started {
            return;
        }
        let word = std::mem::take(&mut self.word);
        match self.pending.take() {
            Some((operator, destination_fds)) => self.redirects.push(Redirect {
                operator,
                destination_fds,
                target_node_type: "word".into(),
                target_text: Some(word),
            }),
            None => self.seg.words.push(word),
        }
        self.started = false;
    }

    fn finish(mut self) -> Parsed {
        self.finish_word();
        let failed = self.failed || self.quote.is_some() || self.pending.is_some();
        self.segs.push(self.seg);
        let (simple_commands, executable_commands) = commands(self.segs);
        let redirects = self.redirects;
        let has_redirects = !redirects.is_empty();
        Parsed {
            simple_commands,
            input_redirect: redirects.iter().any(|r| r.operator.starts_with('<')),
            output_redirect: redirects.iter().any(|r| r.operator.contains('>')),
            result: pb::ShellCommandParsingResult {
                parsing_failed: failed,
                executable_commands,
                has_redirects,
                has_command_substitution: self.substitution,
                all_redirects_are_dev_null: has_redirects.then(|| {
                    redirects.iter().all(|r| {
                        matches!(
                            r.target_text.as_deref(),
                            Some("/dev/null") | Some("1") | Some("2")
                        )
                    })
                }),
                redirects,
            },
        }
    }
}

/// Each non-empty segment's text, and the command it runs (after any `NAME=value` words).
fn commands(segs: Vec<Segment>) -> (Vec<String>, Vec<ExecutableCommand>) {
    let mut simple_commands = Vec::new();
    let mut executable_commands = Vec::new();
    for s in segs {
        let text = s.text.trim().to_string();
        if text.is_empty() {
            continue;
        }
        // Leading `NAME=value` words are environment assignments, not the command.
        let mut words = s.words.into_iter().skip_while(|w| is_assignment(w));
        if let Some(name) = words.next() {
            executable_commands.push(ExecutableCommand {
                name,
                args: words
                    .map(|value| ExecutableCommandArg {
                        r#type: "word".into(),
                        value,
                    })
                    .collect(),
                full_text: text.clone(),
            });
        }
        simple_commands.push(text);
    }
    (simple_commands, executable_commands)
}

/// A `NAME=value` word: an environment assignment before a command, not the command.
pub(crate) fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// A `tool_call_delta` for one shell stream event (stdout/stderr), for the terminal view.
pub(crate) fn shell_delta(event: &pb::ShellStream) -> Option<pb::ToolCallDelta> {
    use pb::shell_tool_call_delta::Delta;
    let delta = match &event.event {
        Some(Event::Stdout(o)) => Delta::Stdout(pb::ShellToolCallStdoutDelta {
            content: o.data.clone(),
        }),
        Some(Event::Stderr(e)) => Delta::Stderr(pb::ShellToolCallStderrDelta {
            content: e.data.clone(),
        }),
        _ => return None,
    };
    Some(pb::ToolCallDelta {
        delta: Some(pb::tool_call_delta::Delta::ShellToolCallDelta(
            pb::ShellToolCallDelta { delta: Some(delta) },
        )),
    })
}

/// Whether this result ends its exec: any result but a shell stream's output events. The
/// run may stop waiting there instead of waiting for `stream_close`.
pub(crate) fn result_is_final(result: &ExecResult) -> bool {
    match result {
        ExecResult::ShellStream(s) => matches!(
            s.event,
            Some(
                Event::Exit(_)
                    | Event::Rejected(_)
                    | Event::PermissionDenied(_)
                    | Event::Backgrounded(_)
                    | Event::SandboxUnsupported(_)
            )
        ),
        _ => true,
    }
}

/// Fold what the client answered into the call's `ShellResult`. `terminals_folder` (the
/// request context's) goes into a background result, so the output file can be named.
pub(crate) fn finish(
    t: pb::ShellToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
    terminals_folder: Option<&str>,
) -> pb::ShellToolCall {
    let mut t = finish_results(t, results, thrown);
    if let Some(r) = t.result.as_mut().filter(|r| r.is_background == Some(true)) {
        r.terminals_folder = terminals_folder.map(str::to_string);
    }
    t
}

fn finish_results(
    mut t: pb::ShellToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::ShellToolCall {
    let args = t.args.clone().unwrap_or_default();
    let mut answers = Answers::gather(&args, results);
    let result = match answers.whole.take() {
        Some(whole) => capped(&args, whole),
        None => answers.into_result(&args, thrown),
    };
    t.result = Some(result);
    t
}

/// Output as the UI keeps it: capped, head and tail kept.
fn ui(s: &str) -> String {
    cap_middle(s, MAX_UI_OUTPUT)
}

/// A whole result the client answered with, its output capped for the UI.
fn capped(args: &pb::ShellArgs, mut result: pb::ShellResult) -> pb::ShellResult {
    let r = match result.result.take() {
        Some(R::Success(mut s)) => {
            s.stdout = ui(&s.stdout);
            s.stderr = ui(&s.stderr);
            R::Success(s)
        }
        Some(R::Failure(mut f)) => {
            f.stdout = ui(&f.stdout);
            f.stderr = ui(&f.stderr);
            R::Failure(f)
        }
        Some(other) => other,
        None => spawn_error(args, "the client returned an empty result".into()),
    };
    result.result = Some(r);
    result
}

/// Everything the client answered for one shell exec, gathered in order.
#[derive(Default)]
struct Answers {
    stdout: String,
    stderr: String,
    interleaved: String,
    exit: Option<pb::ShellStreamExit>,
    /// A stream event that ends the command without running it to an exit.
    terminal: Option<R>,
    background: Option<pb::ShellStreamBackgrounded>,
    /// One whole result instead of a stream.
    whole: Option<pb::ShellResult>,
}

impl Answers {
    fn gather(args: &pb::ShellArgs, results: &[ExecResult]) -> Answers {
        let mut a = Answers::default();
        for m in results {
            match m {
                ExecResult::ShellStream(s) => a.stream_event(args, s.event.as_ref()),
                // A client may answer with one whole result instead of a stream.
                ExecResult::ShellResult(r) if r.result.is_some() => a.whole = Some(r.clone()),
                ExecResult::BackgroundShellSpawnResult(r) => {
                    let mut result = spawned(args, r);
                    if let Some(R::Success(s)) = &result.result {
                        result.pid = s.pid;
                    }
                    a.whole = Some(result);
                }
                _ => {}
            }
        }
        a
    }

    fn stream_event(&mut self, args: &pb::ShellArgs, event: Option<&Event>) {
        match event {
            Some(Event::Stdout(o)) => {
                self.stdout.push_str(&o.data);
                self.interleaved.push_str(&o.data);
            }
            Some(Event::Stderr(e)) => {
                self.stderr.push_str(&e.data);
                self.interleaved.push_str(&e.data);
            }
            Some(Event::Exit(x)) => self.exit = Some(x.clone()),
            Some(Event::Rejected(r)) => self.terminal = Some(R::Rejected(r.clone())),
            Some(Event::PermissionDenied(p)) => {
                self.terminal = Some(R::PermissionDenied(p.clone()))
            }
            Some(Event::SandboxUnsupported(u)) => {
                self.terminal = Some(spawn_error(
                    args,
                    format!("the requested sandbox is not supported: {}", u.reason),
                ))
            }
            Some(Event::Backgrounded(b)) => self.background = Some(b.clone()),
            Some(Event::Start(_)) | Some(Event::HookContext(_)) | None => {}
        }
    }

    /// The call's result from a stream: how it ended, else that it went to the background,
    /// else why it has no exit.
    fn into_result(self, args: &pb::ShellArgs, thrown: Option<&str>) -> pb::ShellResult {
        let mut result = pb::ShellResult::default();
        let r = if let Some(r) = self.terminal.clone() {
            r
        } else if let Some(x) = &self.exit {
            self.exited(args, x)
        } else if let Some(b) = self.background.clone() {
            result.is_background = Some(true);
            result.pid = b.pid;
            self.backgrounded(args, b)
        } else if thrown.is_none()
            && !args.is_background
            && args.hard_timeout.is_some()
            && args.timeout_behavior == pb::TimeoutBehavior::Background as i32
        {
            self.killed_by_hard_timeout(args)
        } else {
            self.unfinished(args, thrown)
        };
        result.result = Some(r);
        result
    }

    fn exited(&self, args: &pb::ShellArgs, x: &pb::ShellStreamExit) -> R {
        let cwd = if x.cwd.is_empty() {
            args.working_directory.clone()
        } else {
            x.cwd.clone()
        };
        // Exit codes arrive as u32; Windows' negative codes wrap, so reinterpret the bits.
        let code = x.code as i32;
        if code == 0 && !x.aborted {
            R::Success(pb::ShellSuccess {
                command: args.command.clone(),
                working_directory: cwd,
                exit_code: 0,
                stdout: ui(&self.stdout),
                stderr: ui(&self.stderr),
                interleaved_output: Some(ui(&self.interleaved)),
                output_location: x.output_location.clone(),
                local_execution_time_ms: x.local_execution_time_ms,
                ..Default::default()
            })
        } else {
            R::Failure(pb::ShellFailure {
                command: args.command.clone(),
                working_directory: cwd,
                exit_code: code,
                stdout: ui(&self.stdout),
                stderr: ui(&self.stderr),
                interleaved_output: Some(ui(&self.interleaved)),
                output_location: x.output_location.clone(),
                aborted: x.aborted,
                abort_reason: x.abort_reason,
                local_execution_time_ms: x.local_execution_time_ms,
                ..Default::default()
            })
        }
    }

    fn backgrounded(&self, args: &pb::ShellArgs, b: pb::ShellStreamBackgrounded) -> R {
        R::Success(pb::ShellSuccess {
            command: args.command.clone(),
            working_directory: args.working_directory.clone(),
            stdout: ui(&self.stdout),
            stderr: ui(&self.stderr),
            interleaved_output: Some(ui(&self.interleaved)),
            shell_id: Some(b.shell_id),
            pid: b.pid,
            ms_to_wait: b.ms_to_wait,
            background_reason: b.reason,
            ..Default::default()
        })
    }

    /// Cursor's client, backgrounding on timeout, ends a command its hard timeout killed
    /// without an exit event: the stream just closes (observed with the SDK 1.0.32).
    fn killed_by_hard_timeout(&self, args: &pb::ShellArgs) -> R {
        R::Failure(pb::ShellFailure {
            command: args.command.clone(),
            working_directory: args.working_directory.clone(),
            exit_code: -1,
            stdout: ui(&self.stdout),
            stderr: ui(&self.stderr),
            interleaved_output: Some(ui(&self.interleaved)),
            aborted: true,
            abort_reason: Some(pb::ShellAbortReason::Timeout as i32),
            ..Default::default()
        })
    }

    fn unfinished(&self, args: &pb::ShellArgs, thrown: Option<&str>) -> R {
        let why = thrown.unwrap_or("the command ended without an exit status");
        let mut error = why.to_string();
        if !self.interleaved.is_empty() {
            error.push_str(&format!(
                "\nOutput before the failure:\n{}",
                cap_middle(&self.interleaved, MAX_MODEL_OUTPUT)
            ));
        }
        spawn_error(args, error)
    }
}

/// The answer to `background_shell_spawn_args`, as the call's `ShellResult`.
fn spawned(args: &pb::ShellArgs, r: &pb::BackgroundShellSpawnResult) -> pb::ShellResult {
    use pb::background_shell_spawn_result::Result as B;
    let result = match &r.result {
        Some(B::Success(s)) => R::Success(pb::ShellSuccess {
            command: args.command.clone(),
            working_directory: if s.working_directory.is_empty() {
                args.working_directory.clone()
            } else {
                s.working_directory.clone()
            },
            shell_id: Some(s.shell_id),
            pid: s.pid,
            ..Default::default()
        }),
        Some(B::Error(e)) => spawn_error(args, e.error.clone()),
        Some(B::Rejected(r)) => R::Rejected(r.clone()),
        Some(B::PermissionDenied(p)) => R::PermissionDenied(p.clone()),
        Some(B::SandboxUnsupported(u)) => spawn_error(
            args,
            format!("the requested sandbox is not supported: {}", u.reason),
        ),
        None => spawn_error(args, "the client returned an empty result".into()),
    };
    pb::ShellResult {
        is_background: matches!(result, R::Success(_)).then_some(true),
        result: Some(result),
        ..Default::default()
    }
}

fn spawn_error(args: &pb::ShellArgs, error: String) -> R {
    R::SpawnError(pb::ShellSpawnError {
        command: args.command.clone(),
        working_directory: args.working_directory.clone(),
        error,
    })
}

/// Output for the model: interleaved when known, capped keeping head and tail.
fn body(interleaved: Option<&str>, stdout: &str, stderr: &str) -> String {
    let raw = match interleaved.filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None if stdout.is_empty() => stderr.to_string(),
        None if stderr.is_empty() => stdout.to_string(),
        None => format!("{}\n{stderr}", stdout.trim_end_matches('\n')),
    };
    if raw.is_empty() {
        return "(no output)\n".into();
    }
    let mut out = cap_middle(&raw, MAX_MODEL_OUTPUT);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn saved(loc: Option<&pb::OutputLocation>) -> String {
    match loc.filter(|l| !l.file_path.is_empty()) {
        Some(l) => format!(
            "[Full output saved to {} ({} lines).]\n",
            l.file_path, l.line_count
        ),
        None => String::new(),
    }
}

/// What the model reads about a shell now running in the background: where its output
/// goes and how to check on it or stop it.
fn background_note(result: &pb::ShellResult, s: &pb::ShellSuccess, id: u32) -> String {
    let file = match result.terminals_folder.as_deref().filter(|f| !f.is_empty()) {
        Some(f) => format!("{}/{id}.txt", f.trim_end_matches(['/', '\\'])),
        None => format!("{id}.txt in the terminals folder"),
    };
    let (pid, stop) = match s.pid {
        Some(p) => (
            format!(", pid {p}"),
            format!("; stop it with run_terminal_cmd `kill {p}`"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "shell {id}{pid}; its output goes to {file} (read it with read_file: the header's `status` says whether it still runs, a footer gives `exit_code` once it ends){stop}"
    )
}

pub(crate) fn render(t: &pb::ShellToolCall) -> (String, bool) {
    let args = t.args.clone().unwrap_or_default();
    let timeout_secs = args.hard_timeout.unwrap_or(args.timeout) / 1000;
    let Some(result) = t.result.as_ref() else {
        return ("The command did not complete.".into(), true);
    };
    match result.result.as_ref() {
        Some(R::Success(s)) => render_success(&args, result, s),
        Some(R::Failure(f)) => render_failure(f, timeout_secs),
        Some(R::Timeout(x)) => (
            format!("The command timed out after {}s.", x.timeout_ms / 1000),
            true,
        ),
        Some(R::Rejected(r)) => {
            let reason = if r.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", r.reason)
            };
            (
                format!("The command was rejected{reason}. Do not retry it unchanged."),
                true,
            )
        }
        Some(R::SpawnError(e)) => (format!("The command could not be run: {}", e.error), true),
        Some(R::PermissionDenied(p)) => (
            format!("Permission denied running the command: {}", p.error),
            true,
        ),
        None => ("The command did not complete.".into(), true),
    }
}

fn render_success(
    args: &pb::ShellArgs,
    result: &pb::ShellResult,
    s: &pb::ShellSuccess,
) -> (String, bool) {
    if let Some(id) = s.shell_id.filter(|_| result.is_background == Some(true)) {
        let note = background_note(result, s, id);
        if s.background_reason.is_none() && args.is_background {
            let unlimited = match args.hard_timeout {
                Some(_) => " The timeout was not applied: a background command runs until it ends or is stopped.",
                None => "",
            };
            return (
                format!("Started in the background: {note}.{unlimited}"),
                false,
            );
        }
        let out = body(s.interleaved_output.as_deref(), &s.stdout, &s.stderr);
        let why = match s
            .background_reason
            .and_then(|r| pb::ShellBackgroundReason::try_from(r).ok())
        {
            Some(pb::ShellBackgroundReason::UserRequest) => {
                "The user moved the command to the background".to_string()
            }
            _ => format!(
                "The command was still running after {}s and was moved to the background",
                s.ms_to_wait.unwrap_or(args.timeout) / 1000
            ),
        };
        return (format!("{out}[{why}: {note}.]"), false);
    }
    let out = body(s.interleaved_output.as_deref(), &s.stdout, &s.stderr);
    (
        format!(
            "{out}{}[exit code: {}]",
            saved(s.output_location.as_ref()),
            s.exit_code
        ),
        false,
    )
}

fn render_failure(f: &pb::ShellFailure, timeout_secs: i32) -> (String, bool) {
    let out = body(f.interleaved_output.as_deref(), &f.stdout, &f.stderr);
    let loc = saved(f.output_location.as_ref());
    if f.aborted {
        let why = match f
            .abort_reason
            .and_then(|r| pb::ShellAbortReason::try_from(r).ok())
        {
            Some(pb::ShellAbortReason::Timeout) => {
                format!("The command timed out after {timeout_secs}s and was stopped.")
            }
            Some(pb::ShellAbortReason::UserAbort) => "The command was stopped by the user.".into(),
            _ => "The command was aborted.".into(),
        };
        return (format!("{out}{loc}[{why}]"), true);
    }
    // A non-zero exit is an ordinary result: the model reads the output and decides.
    (format!("{out}{loc}[exit code: {}]", f.exit_code), false)
}

pub(crate) fn history_args(t: &pb::ShellToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "command": a.command });
    if !a.working_directory.is_empty() {
        v["working_directory"] = json!(a.working_directory);
    }
    if a.is_background {
        v["is_background"] = json!(true);
    }
    let hard = a.hard_timeout.filter(|t| *t > 0);
    // Checkpoints written before the block time carry their timeout in `timeout`.
    let legacy = (a.timeout_behavior == pb::TimeoutBehavior::Cancel as i32).then_some(a.timeout);
    if let Some(t) = hard.or(legacy.filter(|t| *t > 0)) {
        v["timeout"] = json!(t / 1000);
    }
    v
}

pub(crate) fn with_error(mut t: pb::ShellToolCall, message: &str) -> pb::ShellToolCall {
    let args = t.args.clone().unwrap_or_default();
    t.result = Some(pb::ShellResult {
        result: Some(spawn_error(&args, message.to_string())),
        ..Default::default()
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(c: &ExecutableCommand) -> Vec<&str> {
        c.args.iter().map(|a| a.value.as_str()).collect()
    }

    #[test]
    fn parses_simple_commands_and_operators() {
        let p = parse("cd src && FOO=1 cargo test -p 'my crate' | tee out.txt; echo \"a b\"");
        assert_eq!(
            p.simple_commands,
            vec![
                "cd src",
                "FOO=1 cargo test -p 'my crate'",
                "tee out.txt",
                "echo \"a b\""
            ]
        );
        let cmds = &p.result.executable_commands;
        assert_eq!(cmds.len(), 4);
        assert_eq!(
            (cmds[1].name.as_str(), words(&cmds[1])),
            ("cargo", vec!["test", "-p", "my crate"])
        );
        assert_eq!(words(&cmds[3]), vec!["a b"]);
        assert!(!p.result.parsing_failed && !p.result.has_redirects);
    }

    #[test]
    fn records_redirects_and_substitutions() {
        let p = parse("make 2>&1 > /dev/null");
        assert!(p.result.has_redirects && p.output_redirect && !p.input_redirect);
        let r = &p.result.redirects;
        assert_eq!(
            (
                r[0].operator.as_str(),
                r[0].destination_fds.clone(),
                r[0].target_text.as_deref()
            ),
            (">&", vec![2], Some("1"))
        );
        assert_eq!(r[1].target_text.as_deref(), Some("/dev/null"));
        assert_eq!(p.result.all_redirects_are_dev_null, Some(true));
        assert_eq!(words(&p.result.executable_commands[0]), Vec::<&str>::new());
        assert!(parse("echo $(date)").result.has_command_substitution);
        assert!(parse("wc -l < f").input_redirect);
        assert!(parse("echo 'open").result.parsing_failed);
        assert!(parse("(cd x && ls)").result.parsing_failed);
    }
}
