// cordon's web UI: jobs and chat over the /v1 API. No framework and no
// build step, so the binary can embed this file as it is. Every piece of
// text from the server goes into the page as a text node (textContent or
// append(string)), never as HTML: model and program output is untrusted.
'use strict';

const STATES = ['queued', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out'];
const TOKEN_KEY = 'cordon.token';

// ---- DOM helpers ----------------------------------------------------------

// Unicode's explicit bidirectional embeddings, overrides and isolates
// reorder the text after them ("Trojan Source"): a sandbox's file named
// `report\u202Etxt.exe` would read `reportexe.txt`, a command would read
// other than it runs. Text from the server is shown with each replaced.
const REORDERING = /[\u202A-\u202E\u2066-\u2069]/g;
const readable = (text) => String(text).replace(REORDERING, '\uFFFD');

const $ = (sel, root = document) => root.querySelector(sel);

// Properties rather than attributes, so the element's live state is set.
const PROPS = new Set(['value', 'checked', 'disabled', 'hidden', 'open', 'selected']);

function h(tag, props = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (PROPS.has(k)) el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid != null && kid !== false) el.append(typeof kid === 'string' ? readable(kid) : kid);
  }
  return el;
}

// ---- Markdown ---------------------------------------------------------------
//
// The model's answers are Markdown. They are rendered by building elements
// and text nodes from the text, never by parsing HTML: a tag in an answer is
// text, and a link is an anchor only to http(s), opened apart from this page
// (noopener, noreferrer, no Referer). What is supported: headings, fenced
// code, lists, quotes, paragraphs, and inline code, bold, italic and links.

const SAFE_LINK = /^https?:\/\//i;
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*(?![\s*])([\s\S]*?[^\s*])\*|\b_(?![\s_])([\s\S]*?[^\s_])_\b|\[([^\]\n]+)\]\(([^)\s]+)\)/g;

function inline(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    const [whole, , code, bold, bold2, em, em2, label, url] = m;
    if (code != null) out.push(h('code', {}, code));
    else if (bold != null || bold2 != null) out.push(h('strong', {}, inline(bold ?? bold2)));
    else if (em != null || em2 != null) out.push(h('em', {}, inline(em ?? em2)));
    else if (label != null) {
      out.push(SAFE_LINK.test(url)
        ? h('a', { href: url, target: '_blank', rel: 'noopener noreferrer nofollow' }, inline(label))
        : whole);
    }
    at = m.index + whole.length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

function markdown(text) {
  const root = document.createDocumentFragment();
  const lines = readable(text).split('\n');
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) root.append(h('p', {}, inline(para.join('\n'))));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s*(```|~~~)\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      flush();
      list = null;
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) body.push(lines[i]);
      const code = h('code', {}, body.join('\n'));
      if (fence[2]) code.dataset.lang = fence[2];
      root.append(h('pre', { class: 'code' }, code));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      flush();
      list = null;
      root.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      continue;
    }
    const item = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(line);
    if (item) {
      flush();
      const tag = item[1] ? 'ul' : 'ol';
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = h(tag);
        if (item[2] && item[2] !== '1') list.start = Number(item[2]);
        root.append(list);
      }
      list.append(h('li', {}, inline(item[3])));
      continue;
    }
    const quote = /^>\s?(.*)$/.exec(line);
    if (quote) {
      flush();
      list = null;
      root.append(h('blockquote', {}, inline(quote[1])));
      continue;
    }
    if (!line.trim()) {
      flush();
      list = null;
      continue;
    }
    if (list && /^\s+\S/.test(line)) {
      // A list item's continuation line.
      list.lastChild.append('\n', ...inline(line.trim()));
      continue;
    }
    list = null;
    para.push(line);
  }
  flush();
  return root;
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

function fmtTime(iso) {
  return iso ? new Date(iso).toLocaleString() : '—';
}

function fmtDuration(ms) {
  if (ms == null || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} m ${Math.round((ms % 60000) / 1000)} s`;
}

function fmtSize(n) {
  if (n == null) return '';
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function jobDuration(job) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return end - Date.parse(job.started_at);
}

const badge = (state) => h('span', { class: `badge state-${state}` }, state);

// A running job's duration as an element that keeps counting: every
// second, each one on the page shows the time since its start.
function durationOf(job) {
  const running = job.started_at && !job.finished_at;
  return h('span', { 'data-started': running ? job.started_at : null }, fmtDuration(jobDuration(job)));
}
setInterval(() => {
  for (const el of document.querySelectorAll('[data-started]')) {
    el.textContent = fmtDuration(Date.now() - Date.parse(el.dataset.started));
  }
}, 1000);

// Keeps a scrolling element at its bottom while the user has not scrolled
// up, so live output follows without stealing the reader's place.
function follow(el) {
  let pinned = true;
  let queued = false;
  el.addEventListener('scroll', () => {
    pinned = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
  });
  return () => {
    if (!pinned || queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; el.scrollTop = el.scrollHeight; });
  };
}

// ---- the API ----------------------------------------------------------------

const auth = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY),
  set(token, remember) {
    this.clear();
    (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
  },
};

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let signInMessage = '';

// Paths are relative so the UI also works behind a proxy that mounts the
// server under a prefix.
async function api(method, path, { body, headers = {}, signal, raw = false, token } = {}) {
  const init = { method, signal, headers: { Authorization: `Bearer ${token ?? auth.get()}`, ...headers } };
  if (body instanceof Blob) {
    init.body = body;
    init.headers['Content-Type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const r = await fetch(path, init);
  if (!r.ok) {
    let code = `http_${r.status}`;
    let message = `${r.status} ${r.statusText}`;
    try {
      const j = await r.json();
      if (j?.error) ({ code, message } = j.error);
    } catch { /* not JSON: keep the status line */ }
    // A token that stopped working (revoked, or the server's database was
    // replaced) sends the user back to sign in, saying why.
    if (r.status === 401 && token === undefined && auth.get()) {
      auth.clear();
      signInMessage = message;
      setTimeout(route);
    }
    throw new ApiError(r.status, code, message);
  }
  return raw ? r : r.json();
}

const enc = (path) => path.split('/').map(encodeURIComponent).join('/');

// Reads a text/event-stream body and calls onEvent({id, event, data}) for
// each event. EventSource cannot send an Authorization header, hence fetch
// and this parser.
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let ev = { id: null, event: 'message', data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    // A CR at the very end may be the first half of a CRLF.
    const hold = buf.endsWith('\r') ? '\r' : '';
    const lines = (hold ? buf.slice(0, -1) : buf).split(/\r\n|\r|\n/);
    buf = lines.pop() + hold;
    for (const line of lines) {
      if (line === '') {
        if (ev.data.length) {
          const text = ev.data.join('\n');
          let data = text;
          try { data = JSON.parse(text); } catch { /* plain text data */ }
          onEvent({ id: ev.id, event: ev.event, data });
        }
        ev = { id: null, event: 'message', data: [] };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') ev.id = value;
      else if (field === 'event') ev.event = value;
      else if (field === 'data') ev.data.push(value);
    }
  }
}

// Follows a job's events to its `finished` event. A dropped connection is
// resumed with Last-Event-ID, so nothing is shown twice or lost.
async function followJob(id, onEvent, onStatus, signal) {
  let last = null;
  let delay = 500;
  while (!signal.aborted) {
    let finished = false;
    try {
      const headers = last == null ? {} : { 'Last-Event-ID': last };
      const r = await api('GET', `v1/jobs/${encodeURIComponent(id)}/events`, { headers, signal, raw: true });
      onStatus('live');
      delay = 500;
      await readEvents(r, (e) => {
        if (e.id != null) last = e.id;
        if (e.event === 'finished') finished = true;
        onEvent(e);
      });
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status !== 503) throw e;
    }
    if (finished || signal.aborted) return;
    onStatus('reconnecting…');
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 5000);
  }
}

// ---- the agent's events, for chat and agent jobs ---------------------------

// What a tool call does, on its folded line: the label cordon made from its
// arguments (the command, the path, …), or for an event logged before
// labels were, the argument most likely to say.
function callLabel(label, input) {
  if (typeof label === 'string' && label !== '') return label;
  if (!input || typeof input !== 'object') return '';
  for (const k of ['command', 'path', 'pattern', 'query', 'code']) {
    if (typeof input[k] === 'string') return input[k];
  }
  const first = Object.values(input).find((v) => typeof v === 'string');
  return first ?? '';
}

function oneLine(s, max = 120) {
  const line = s.split('\n')[0];
  return line.length > max || s.includes('\n') ? `${line.slice(0, max)}…` : line;
}

class Transcript {
  constructor(root) {
    this.root = root;
    this.tools = new Map();
    this.text = null; // the answer the next delta extends: its text and element
    this.thinking = null;
    this.step = []; // elements streamed for the current model request
    // The model's plan (update_plan), kept in view at the top.
    this.planEl = h('section', { class: 'plan', hidden: true, 'aria-label': 'plan' });
    root.prepend(this.planEl);
    this.scroll = follow(root);
  }

  // The whole plan replaces the last; its text is the model's, so text
  // nodes only.
  plan(p) {
    const steps = Array.isArray(p?.plan) ? p.plan : [];
    const done = steps.filter((s) => s.status === 'completed').length;
    const marks = { completed: '✓', in_progress: '▸', pending: '○' };
    this.planEl.replaceChildren(
      h('div', { class: 'label' }, `plan · ${done} of ${steps.length} done`),
      p?.explanation ? h('p', { class: 'muted' }, String(p.explanation)) : [],
      h('ol', {}, steps.map((s) => h('li', { class: `step ${s.status}` },
        h('span', { class: 'mark', 'aria-hidden': 'true' }, marks[s.status] ?? '○'),
        String(s.step)))));
    this.planEl.hidden = steps.length === 0;
  }

  add(el) {
    this.root.append(el);
    this.step.push(el);
    this.scroll();
    return el;
  }

  user(text) {
    this.text = null;
    this.add(h('div', { class: 'msg user' }, text));
  }

  note(text, cls = '') {
    this.text = null;
    this.add(h('div', { class: `note ${cls}` }, text));
  }

  // The answer so far, rendered again from its whole text as it grows.
  appendText(text) {
    if (!this.text) {
      this.text = { raw: '', el: this.add(h('div', { class: 'msg assistant' })) };
    }
    this.text.raw += text;
    this.text.el.replaceChildren(markdown(this.text.raw));
    this.scroll();
  }

  appendThinking(text) {
    if (!this.thinking) {
      this.thinking = document.createTextNode('');
      this.add(h('details', { class: 'thinking' }, h('summary', {}, 'thinking'), h('pre', {}, this.thinking)));
    }
    this.thinking.appendData(text);
  }

  toolStarted(id, name, input, label) {
    this.text = null;
    this.thinking = null;
    const output = h('pre', { class: 'tool-output' }, 'running…');
    const meta = h('span', { class: 'tool-meta' });
    const el = h('details', { class: 'tool running' },
      h('summary', {},
        h('span', { class: 'tool-icon', 'aria-hidden': 'true' }),
        h('span', { class: 'tool-name' }, name),
        h('span', { class: 'tool-arg' }, oneLine(callLabel(label, input))),
        meta),
      h('div', { class: 'tool-body' },
        h('div', { class: 'label' }, 'input'),
        h('pre', {}, JSON.stringify(input, null, 2)),
        h('div', { class: 'label' }, 'output'),
        output));
    el.dataset.toolId = id;
    this.tools.set(id, { el, output, meta });
    this.add(el);
  }

  // Output of a running call, as it arrives; the result replaces it. Text
  // nodes only: sandbox output never becomes markup.
  toolOutput(id, text) {
    const t = this.tools.get(id);
    if (!t || !t.el.classList.contains('running')) return;
    if (!t.live) {
      t.live = document.createTextNode('');
      t.output.replaceChildren(t.live);
    }
    t.live.appendData(readable(text));
    // The end is what matters while it runs: keep the node bounded.
    if (t.live.length > 64 * 1024) t.live.deleteData(0, t.live.length - 64 * 1024);
    this.scroll();
  }

  toolFinished(id, output, isError, durationMs) {
    const t = this.tools.get(id);
    if (!t) return;
    t.el.classList.remove('running');
    t.el.classList.add(isError ? 'failed' : 'done');
    t.output.textContent = readable(output);
    t.meta.textContent = durationMs == null ? (isError ? 'error' : '') : fmtDuration(durationMs);
  }

  // Tool calls that will get no result (a cancelled or broken turn) stop
  // spinning.
  settle() {
    for (const t of this.tools.values()) {
      if (t.el.classList.contains('running')) {
        t.el.classList.replace('running', 'unfinished');
        t.output.textContent = '(no result)';
      }
    }
  }

  handle(ev) {
    switch (ev.type) {
      case 'turn_started':
        this.step = [];
        break;
      case 'text_delta':
        this.appendText(ev.text);
        break;
      case 'thinking_delta':
        this.appendThinking(ev.text);
        break;
      case 'retrying':
        // What streamed for the failed request is replaced by the retry.
        for (const el of this.step) if (!el.classList.contains('tool')) el.remove();
        this.step = [];
        this.text = this.thinking = null;
        this.note(`retrying: ${ev.reason}`, 'muted');
        break;
      case 'assistant_message':
        this.text = this.thinking = null;
        break;
      case 'tool_call_started':
        this.toolStarted(ev.id, ev.name, ev.input, ev.label);
        break;
      case 'tool_output':
        this.toolOutput(ev.id, ev.text);
        break;
      case 'tool_call_finished':
        this.toolFinished(ev.id, ev.output, ev.is_error, ev.duration_ms);
        break;
      case 'hook_failed':
        this.note(ev.message, 'muted');
        break;
      case 'plan_updated':
        this.plan(ev);
        break;
      case 'compaction_started':
        this.note('compacting the conversation…', 'muted');
        break;
      case 'compacted':
        this.note(`compacted ${ev.replaced_messages} messages (~${ev.tokens_before} → ~${ev.tokens_after} tokens)`, 'muted');
        break;
      case 'turn_completed': {
        const u = ev.usage || {};
        const parts = [`${ev.steps} step${ev.steps === 1 ? '' : 's'}`,
          `${u.input_tokens ?? 0} in / ${u.output_tokens ?? 0} out tokens`];
        if (ev.cost_usd != null) parts.push(`$${ev.cost_usd.toFixed(4)}`);
        if (ev.stop_reason !== 'end_turn') parts.unshift(ev.stop_reason);
        this.note(parts.join(' · '), ev.stop_reason === 'refusal' ? 'bad' : 'muted done-line');
        this.settle();
        break;
      }
      case 'error':
        this.note(ev.message, 'bad');
        this.settle();
        break;
      default:
        break;
    }
  }

  // A stored conversation (GET /v1/sessions/{id}): the same blocks as live.
  history(messages, labels) {
    for (const m of messages) {
      if (m.role === 'user') {
        for (const r of m.tool_results || []) this.toolFinished(r.tool_use_id, r.content, r.is_error);
        if (m.text) this.user(m.text);
      } else {
        for (const b of m.content || []) {
          if (b.type === 'text') this.appendText(b.text);
          else if (b.type === 'thinking') this.appendThinking(b.thinking);
          else if (b.type === 'tool_use') {
            this.toolStarted(b.id, b.name, b.input, labels[b.id]);
            if (b.name === 'update_plan') this.plan(b.input);
          } else if (b.type === 'server_tool_use') this.toolStarted(b.id, b.name, b.input, labels[b.id]);
          else if (b.type === 'web_search_tool_result') {
            // The provider's search: its pages, as the live event showed them.
            const hits = Array.isArray(b.content) ? b.content : null;
            const text = hits
              ? (hits.length ? hits.map((r) => (r.title ? `${r.title} — ${r.url}` : String(r.url))).join('\n') : 'No results.')
              : `The search failed: ${b.content?.error_code ?? 'an unreadable result'}.`;
            this.toolFinished(b.tool_use_id, text, !hits);
          }
        }
        this.text = this.thinking = null;
      }
    }
  }
}

// ---- views ------------------------------------------------------------------

function errorBox() {
  const el = h('p', { class: 'error', role: 'alert', hidden: true });
  el.show = (e) => {
    el.textContent = e ? (e.message || String(e)) : '';
    el.hidden = !e;
  };
  return el;
}

function signIn(main) {
  const token = h('input', { type: 'password', name: 'token', autocomplete: 'off', required: true, autofocus: true });
  const remember = h('input', { type: 'checkbox', name: 'remember' });
  const err = errorBox();
  if (signInMessage) err.show(new Error(signInMessage));
  signInMessage = '';
  const form = h('form', { class: 'card sign-in' },
    h('h1', {}, 'Sign in to cordon'),
    h('label', {}, 'API token', token),
    h('p', { class: 'muted' }, 'Create one with ', h('code', {}, 'cordon token create --tenant NAME'), '.'),
    h('label', { class: 'inline' }, remember, 'Remember on this browser'),
    err,
    h('button', { type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.show(null);
    const t = token.value.trim();
    try {
      await api('GET', 'v1/jobs?limit=1', { token: t });
      auth.set(t, remember.checked);
      route();
    } catch (ex) {
      err.show(ex);
    }
  });
  main.append(form);
  token.focus();
}

let listFilter = '';

function jobList(main, signal) {
  const filter = h('select', { 'aria-label': 'state' },
    h('option', { value: '' }, 'all states'),
    STATES.map((s) => h('option', { value: s }, s)));
  filter.value = listFilter;
  const tbody = h('tbody');
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load more');
  const err = errorBox();
  main.append(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Jobs'), h('span', { class: 'spacer' }), filter,
      h('a', { class: 'button', href: '#/new' }, 'New job')),
    err,
    h('table', { class: 'jobs' },
      h('thead', {}, h('tr', {}, ['job', 'kind', 'state', 'created', 'duration', 'exit'].map((c) => h('th', {}, c)))),
      tbody),
    more);

  let rows = [];
  let cursor = null;
  let shown = '';
  const query = () => (listFilter ? `&state=${listFilter}` : '');

  function render() {
    const sig = JSON.stringify(rows) + cursor;
    if (sig === shown) return; // nothing changed: leave the DOM alone
    shown = sig;
    tbody.replaceChildren(...rows.map((j) => h('tr', { 'data-id': j.id },
      // What the job does, then its id: ids alone say nothing.
      h('td', { class: 'job-cell' },
        h('a', { href: `#/jobs/${j.id}`, title: j.id }, j.preview || j.id),
        j.preview ? h('div', { class: 'muted job-id' }, j.id) : null),
      h('td', {}, j.kind),
      h('td', {}, badge(j.state)),
      h('td', {}, fmtTime(j.created_at)),
      h('td', { class: 'duration' }, durationOf(j)),
      h('td', {}, j.exit_code ?? ''))));
    if (!rows.length) {
      tbody.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, listFilter ? `No ${listFilter} jobs.` : 'No jobs yet.')));
    }
    more.hidden = !cursor;
  }

  // Re-reads what is shown (up to the API's page limit) so states move live;
  // rows loaded further down keep their place.
  async function refresh() {
    const n = Math.min(Math.max(rows.length, 50), 200);
    const asked = listFilter;
    const page = await api('GET', `v1/jobs?limit=${n}${query()}`, { signal });
    if (asked !== listFilter) return; // the filter changed meanwhile
    const fresh = new Set(page.jobs.map((j) => j.id));
    const tail = rows.slice(n).filter((j) => !fresh.has(j.id));
    rows = page.jobs.concat(tail);
    if (!tail.length) cursor = page.next_cursor;
    render();
  }

  more.addEventListener('click', async () => {
    try {
      const page = await api('GET', `v1/jobs?limit=50&cursor=${cursor}${query()}`, { signal });
      rows = rows.concat(page.jobs);
      cursor = page.next_cursor;
      render();
    } catch (e) { err.show(e); }
  });
  filter.addEventListener('change', () => {
    listFilter = filter.value;
    rows = [];
    refresh().catch((e) => err.show(e));
  });

  (async () => {
    while (!signal.aborted) {
      if (!document.hidden) {
        try { await refresh(); err.show(null); } catch (e) { if (!signal.aborted) err.show(e); }
      }
      await sleep(2000, signal);
    }
  })();
}

const EXAMPLE_STEPS = `[
  {"tool": "shell", "command": "echo hello > hello.txt"},
  {"tool": "python", "code": "print(open('hello.txt').read().upper())"},
  {"tool": "read_file", "path": "hello.txt"}
]`;

// The kinds of job the server takes, each with the example its API
// document gives, read from that document: a kind added to the server
// appears in the form with no change here.
let jobKindsLoad = null;
function jobKinds() {
  jobKindsLoad ??= (async () => {
    const r = await fetch('openapi.json');
    if (!r.ok) throw new Error(`The server's API document did not load: ${r.status} ${r.statusText}`);
    const doc = await r.json();
    const kinds = doc.components?.schemas?.JobKind?.enum;
    if (!Array.isArray(kinds)) throw new Error('The server\'s API document lists no kinds of job');
    const examples = doc.paths?.['/v1/jobs']?.post?.requestBody?.content?.['application/json']?.examples ?? {};
    return kinds.map((k) => ({ kind: String(k), example: examples[k]?.value ?? { kind: k } }));
  })();
  jobKindsLoad.catch(() => { jobKindsLoad = null; });
  return jobKindsLoad;
}

// The kinds with a form of their own; any other kind is written as JSON.
const KIND_GROUP = {
  shell: 'shell', python: 'code', javascript: 'code', typescript: 'code',
  steps: 'steps', gui: 'steps', agent: 'agent', build: 'build',
};
// The fields the form's own inputs set for every kind.
const COMMON_FIELDS = ['kind', 'image', 'timeout_secs', 'memory', 'network'];

function newJob(main) {
  const kind = h('select', { name: 'kind' });
  const examples = new Map();
  const command = h('textarea', { name: 'command', rows: 4, spellcheck: 'false', placeholder: 'echo hello; ls -la' });
  const code = h('textarea', { name: 'code', rows: 10, spellcheck: 'false' });
  const steps = h('textarea', { name: 'steps', rows: 10, spellcheck: 'false', value: EXAMPLE_STEPS });
  const cont = h('input', { type: 'checkbox', name: 'continue_on_error' });
  const display = h('input', { name: 'display', placeholder: '1280x800' });
  const displayRow = h('label', {}, 'Display (WIDTHxHEIGHT)', display);
  const prompt = h('textarea', { name: 'prompt', rows: 5, placeholder: 'What should the agent do?' });
  const model = h('input', { name: 'model', placeholder: 'server default' });
  const maxSteps = h('input', { name: 'max_steps', type: 'number', min: 1, max: 200, placeholder: 'default' });
  const timeout = h('input', { name: 'timeout_secs', type: 'number', min: 1, placeholder: 'default' });
  const memory = h('input', { name: 'memory', placeholder: 'e.g. 512M' });
  const network = h('select', { name: 'network' }, h('option', { value: 'off' }, 'off'), h('option', { value: 'loopback' }, 'loopback'));
  const image = h('select', { name: 'image' }, h('option', { value: '' }, 'server default'));
  const imageRow = h('label', {}, 'Image', image);
  const buildName = h('input', { name: 'name', placeholder: 'my-env:1', spellcheck: 'false' });
  const dockerfile = h('textarea', { name: 'dockerfile', rows: 8, spellcheck: 'false', placeholder: 'FROM debian:bookworm\nRUN apt-get update && apt-get install -y python3' });
  const err = errorBox();
  // The names this tenant may run in: the catalog's (but `HOST/PATH/*`,
  // which stands for many) and its own.
  api('GET', 'v1/images').then((list) => {
    const names = list.images.filter((i) => !i.name.endsWith('/*')).map((i) => i.name)
      .concat(list.own.map((i) => i.name));
    image.append(...names.map((n) => h('option', { value: n }, n)));
  }).catch(() => {});
  const fields = h('textarea', { name: 'fields', rows: 8, spellcheck: 'false' });
  const submit = h('button', { type: 'submit', disabled: true }, 'Submit');

  const groups = {
    shell: h('label', {}, 'Command (bash)', command),
    code: h('label', {}, 'Code', code),
    steps: h('div', {}, h('label', {}, 'Steps (JSON: tool is shell, python, javascript, typescript, write_file, read_file or, with a display, computer)', steps),
      displayRow,
      h('label', { class: 'inline' }, cont, 'Continue after a failed step')),
    agent: h('div', {}, h('label', {}, 'Prompt', prompt),
      h('div', { class: 'row' }, h('label', {}, 'Model', model), h('label', {}, 'Max steps', maxSteps))),
    build: h('div', {}, h('label', {}, 'Image name (kept as one of your images)', buildName),
      h('label', {}, 'Dockerfile (FROM names an image you may use)', dockerfile)),
    fields: h('label', {}, 'Fields (a JSON object: this kind\'s own, as the API documents them)', fields),
  };
  const groupOf = (k) => KIND_GROUP[k] ?? 'fields';
  const showGroup = () => {
    for (const [name, el] of Object.entries(groups)) el.hidden = name !== groupOf(kind.value);
    displayRow.hidden = kind.value !== 'gui';
    imageRow.hidden = kind.value === 'build';
    const example = examples.get(kind.value) ?? {};
    code.placeholder = typeof example.code === 'string' ? example.code : '';
    if (groupOf(kind.value) === 'fields') {
      const own = Object.fromEntries(Object.entries(example).filter(([k]) => !COMMON_FIELDS.includes(k)));
      fields.value = JSON.stringify(own, null, 2);
    }
  };
  kind.addEventListener('change', showGroup);
  showGroup();
  jobKinds().then((kinds) => {
    for (const { kind: k, example } of kinds) examples.set(k, example);
    kind.append(...kinds.map(({ kind: k }) => h('option', { value: k }, k)));
    showGroup();
    submit.disabled = false;
  }).catch((e) => err.show(e));

  const form = h('form', { class: 'card job-form' },
    h('h1', {}, 'New job'),
    h('label', {}, 'Kind', kind),
    Object.values(groups),
    imageRow,
    h('fieldset', {}, h('legend', {}, 'Limits'),
      h('div', { class: 'row' },
        h('label', {}, 'Timeout (s)', timeout),
        h('label', {}, 'Memory', memory),
        h('label', {}, 'Network', network))),
    err,
    submit);

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.show(null);
    const body = { kind: kind.value };
    const g = groupOf(kind.value);
    if (g === 'shell') body.command = command.value;
    if (g === 'code') body.code = code.value;
    if (g === 'steps') {
      try { body.steps = JSON.parse(steps.value); } catch (ex) {
        err.show(new Error(`The steps are not valid JSON: ${ex.message}`));
        return;
      }
      if (cont.checked) body.continue_on_error = true;
      if (kind.value === 'gui' && display.value.trim()) body.display = display.value.trim();
    }
    if (g === 'agent') {
      body.prompt = prompt.value;
      if (model.value.trim()) body.model = model.value.trim();
      if (maxSteps.value) body.max_steps = Number(maxSteps.value);
    }
    if (g === 'fields') {
      let own;
      try { own = JSON.parse(fields.value); } catch (ex) {
        err.show(new Error(`The fields are not valid JSON: ${ex.message}`));
        return;
      }
      if (own === null || typeof own !== 'object' || Array.isArray(own)) {
        err.show(new Error('The fields must be a JSON object, such as {"text": "hi"}'));
        return;
      }
      for (const [k, v] of Object.entries(own)) if (k !== 'kind') body[k] = v;
    }
    if (g === 'build') {
      body.name = buildName.value.trim();
      body.dockerfile = dockerfile.value;
    } else if (image.value) {
      body.image = image.value;
    }
    if (timeout.value) body.timeout_secs = Number(timeout.value);
    if (memory.value.trim()) body.memory = memory.value.trim();
    body.network = network.value;
    submit.disabled = true;
    try {
      const job = await api('POST', 'v1/jobs', { body });
      location.hash = `#/jobs/${job.id}`;
    } catch (ex) {
      err.show(ex);
    } finally {
      submit.disabled = false;
    }
  });
  // Ctrl+Enter submits from any text box, as in most editors.
  form.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  main.append(form);
  command.focus();
}

// The job's workspace: browse directories, view or download files, upload.
function filesPanel(id, signal) {
  let dir = '';
  const err = errorBox();
  const crumbs = h('div', { class: 'crumbs' });
  const tbody = h('tbody');
  const previewName = h('h3');
  const previewText = h('pre');
  const previewImage = h('img', { alt: '', hidden: true });
  const preview = h('div', { class: 'preview', hidden: true }, previewName, previewText, previewImage);
  let imageUrl = null;
  const upload = h('input', { type: 'file', multiple: true, 'aria-label': 'upload files' });
  const base = `v1/jobs/${encodeURIComponent(id)}/files`;
  const full = (name) => (dir ? `${dir}/${name}` : name);

  async function load() {
    err.show(null);
    try {
      const listing = await api('GET', dir ? `${base}/${enc(dir)}` : base, { signal });
      render(listing.entries);
    } catch (e) { if (!signal.aborted) err.show(e); }
  }

  function render(entries) {
    const parts = dir ? dir.split('/') : [];
    // Spread, not nested: replaceChildren would print an array as text
    // (an anchor's text is its href).
    crumbs.replaceChildren(
      h('a', { href: '', onclick: (e) => { e.preventDefault(); dir = ''; load(); } }, '/workspace'),
      ...parts.flatMap((p, i) => ['/', h('a', { href: '', onclick: (e) => { e.preventDefault(); dir = parts.slice(0, i + 1).join('/'); load(); } }, p)]));
    tbody.replaceChildren(...entries.map((f) => {
      const name = f.type === 'directory'
        ? h('a', { href: '', class: 'dir', onclick: (e) => { e.preventDefault(); dir = full(f.name); load(); } }, `${f.name}/`)
        : h('span', {}, f.name);
      const actions = f.type === 'file' ? [
        h('button', { type: 'button', class: 'link', onclick: () => view(f) }, 'view'),
        h('button', { type: 'button', class: 'link', onclick: () => download(f) }, 'download'),
      ] : [];
      return h('tr', {}, h('td', {}, name), h('td', { class: 'num' }, fmtSize(f.size)), h('td', {}, actions));
    }));
    if (!entries.length) tbody.append(h('tr', {}, h('td', { colspan: 3, class: 'muted' }, 'empty')));
  }

  async function fetchFile(f) {
    return api('GET', `${base}/${enc(full(f.name))}`, { signal, raw: true });
  }

  async function view(f) {
    try {
      if (f.size > 1024 * 1024) throw new Error(`${f.name} is ${fmtSize(f.size)}; download it instead`);
      const resp = await fetchFile(f);
      const type = resp.headers.get('Content-Type') || '';
      previewName.textContent = readable(full(f.name));
      if (imageUrl) URL.revokeObjectURL(imageUrl);
      imageUrl = null;
      if (type.startsWith('image/')) {
        // Shown as an <img>: an SVG's scripts never run there.
        imageUrl = URL.createObjectURL(await resp.blob());
        previewImage.src = imageUrl;
        previewImage.alt = readable(full(f.name));
        previewImage.hidden = false;
        previewText.hidden = true;
      } else {
        const text = await resp.text();
        previewText.textContent = text.includes('\u0000') ? '(binary; download it instead)' : readable(text);
        previewText.hidden = false;
        previewImage.hidden = true;
      }
      preview.hidden = false;
    } catch (e) { err.show(e); }
  }

  async function download(f) {
    try {
      const url = URL.createObjectURL(await (await fetchFile(f)).blob());
      // Saved under the name as shown: no reordered name on the user's disk.
      const a = h('a', { href: url, download: readable(f.name), hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 30000);
    } catch (e) { err.show(e); }
  }

  upload.addEventListener('change', async () => {
    try {
      for (const file of upload.files) {
        await api('PUT', `${base}/${enc(full(file.name))}`, { body: file, signal });
      }
    } catch (e) { err.show(e); }
    upload.value = '';
    load();
  });

  const el = h('section', { class: 'files' },
    h('div', { class: 'toolbar' }, h('h2', {}, 'Files'), crumbs, h('span', { class: 'spacer' }),
      h('button', { type: 'button', class: 'secondary', onclick: load }, 'Refresh'),
      h('label', { class: 'button secondary upload' }, 'Upload…', upload)),
    err,
    h('table', {}, tbody),
    preview);
  load();
  return { el, load };
}

// The job's desktop while it runs: noVNC over the job's /vnc WebSocket.
// View-only until the user takes control, which reconnects with
// access=control: the server enforces view-only, not just this page.
function desktopPanel(id, signal) {
  const err = errorBox();
  const status = h('span', { class: 'muted status' }, 'connecting…');
  const control = h('input', { type: 'checkbox', name: 'control' });
  const screen = h('div', { class: 'screen', 'aria-label': 'the job\'s desktop' });
  let rfb = null;
  let ended = false;
  let last = null;

  async function connect() {
    rfb?.disconnect();
    rfb = null;
    if (ended) return;
    let RFB;
    try {
      ({ default: RFB } = await import('./novnc/core/rfb.js'));
    } catch {
      err.show(new Error('This server has no noVNC, so the desktop cannot be shown (install the novnc package and restart cordon serve).'));
      status.textContent = '';
      return;
    }
    if (signal.aborted) return;
    const url = new URL(`v1/jobs/${encodeURIComponent(id)}/vnc`, location.href);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    if (control.checked) url.searchParams.set('access', 'control');
    status.textContent = 'connecting…';
    // A WebSocket cannot carry an Authorization header: the token travels
    // as a subprotocol, which the server reads and never echoes.
    const r = new RFB(screen, url.href, { wsProtocols: ['binary', `cordon.bearer.${auth.get()}`] });
    r.viewOnly = !control.checked;
    r.scaleViewport = true;
    r.addEventListener('connect', () => {
      if (rfb !== r) return;
      status.textContent = control.checked ? 'live · you have control' : 'live · view only';
      screen.dataset.state = 'connected';
    });
    r.addEventListener('disconnect', () => {
      if (rfb !== r) return;
      screen.dataset.state = 'disconnected';
      status.textContent = ended ? 'the job has ended' : 'disconnected';
      // noVNC clears its canvas on disconnect: keep the last picture.
      if (last) screen.replaceChildren(h('img', { class: 'last', src: last, alt: 'the desktop when it closed' }));
    });
    // A copy of the screen every second, cheap next to the stream itself.
    const keep = setInterval(() => {
      if (rfb !== r) return clearInterval(keep);
      if (screen.dataset.state === 'connected') {
        const canvas = screen.querySelector('canvas');
        if (canvas?.width) last = canvas.toDataURL();
      }
    }, 1000);
    rfb = r;
  }

  control.addEventListener('change', connect);
  signal.addEventListener('abort', () => { rfb?.disconnect(); rfb = null; });
  const el = h('section', { class: 'desktop' },
    h('div', { class: 'toolbar' }, h('h2', {}, 'Desktop'), status, h('span', { class: 'spacer' }),
      h('label', { class: 'control' }, control, ' Take control')),
    err, screen);
  return {
    el,
    connect,
    // The job ended: its desktop is gone; the last picture stays.
    end() {
      ended = true;
      control.disabled = true;
      if (screen.dataset.state !== 'connected') status.textContent = 'the job has ended';
    },
  };
}

// "Open Lab": JupyterLab in a job's or session's sandbox (`path`, e.g.
// v1/jobs/ID/lab). POST …/lab answers a URL on the Lab's own origin with a
// one-time ticket; the bearer token never leaves this page. Starting
// Jupyter takes seconds (minutes on a slow machine), far longer than a
// browser lets a page open a window after a click, so the window is opened
// at once, blank, and sent to the URL when it comes. Before it goes there
// it is cut from this page (`opener = null`), as `noopener` would have
// done, and this page's Cross-Origin-Opener-Policy puts the Lab in a
// browsing context group of its own: the Lab's pages, which the sandbox
// shapes, get no handle on this one. Were the window blocked or closed
// meanwhile, the URL is offered as a link instead.
function labControl(path, signal) {
  const button = h('button', { type: 'button', class: 'secondary lab-open' }, 'Open Lab');
  const status = h('span', { class: 'muted lab-status', role: 'status' });
  const err = errorBox();
  err.classList.add('lab-error');
  let timer = null;
  const settle = (text = '') => {
    clearInterval(timer);
    timer = null;
    status.replaceChildren(text);
    button.disabled = false;
  };

  button.addEventListener('click', async () => {
    err.show(null);
    button.disabled = true;
    const w = window.open('', '_blank');
    if (w) {
      w.document.title = 'Opening JupyterLab…';
      w.document.body?.append('Starting JupyterLab in the sandbox…');
    }
    const started = Date.now();
    const tick = () => status.replaceChildren(`starting JupyterLab… ${fmtDuration(Date.now() - started)}`);
    tick();
    timer = setInterval(tick, 1000);
    let url;
    let expiresIn;
    try {
      ({ url, expires_in: expiresIn } = await api('POST', path, { signal }));
      if (typeof url !== 'string' || !/^https?:\/\//.test(url)) throw new Error('the server answered no Lab URL');
    } catch (e) {
      w?.close();
      settle();
      if (!signal.aborted) err.show(e);
      return;
    }
    if (w && !w.closed) {
      w.opener = null;
      w.location.replace(url);
      settle('opened in a new tab');
    } else {
      // A click on a link opens a window whatever a popup blocker thinks.
      // It lets one browser in, once, for `expires_in` seconds.
      settle();
      const link = h('a', { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'lab-link' }, 'Open the Lab');
      const spent = setTimeout(() => { if (link.isConnected) settle(); }, (expiresIn || 60) * 1000);
      link.addEventListener('click', () => {
        clearTimeout(spent);
        setTimeout(() => settle('opened in a new tab'));
      });
      status.replaceChildren(link, ' (the link works once, for a minute)');
    }
  });
  signal.addEventListener('abort', () => clearInterval(timer));
  return { el: h('span', { class: 'lab' }, button, status), err, button };
}

// "Ports": what listens in a job's or session's sandbox (`base`, e.g.
// v1/jobs/ID), each previewable one with an "Open" button. POST
// …/ports/PORT/preview answers a signed link to the port's own origin; as
// for the Lab, the tab is opened at once, cut from this page, and sent
// there when the link comes, so the page (the sandbox's to shape) gets no
// handle on this one. The link lets any browser in until it expires, so it
// is also shown to be copied; the bearer token never leaves this page.
function portsPanel(base, signal) {
  const list = h('ul', { class: 'ports' });
  const look = h('button', { type: 'button', class: 'secondary ports-look' }, 'Look again');
  const status = h('span', { class: 'muted ports-status', role: 'status' });
  const err = errorBox();
  err.classList.add('ports-error');

  async function open(port, row) {
    err.show(null);
    const w = window.open('', '_blank');
    if (w) w.document.title = `Opening port ${port}…`;
    let preview;
    try {
      preview = await api('POST', `${base}/ports/${port}/preview`, { signal, body: {} });
      if (typeof preview.url !== 'string' || !/^https?:\/\//.test(preview.url)) throw new Error('the server answered no preview URL');
    } catch (e) {
      w?.close();
      if (!signal.aborted) err.show(e);
      return;
    }
    if (w && !w.closed) {
      w.opener = null;
      w.location.replace(preview.url);
    }
    const link = h('a', { href: preview.url, target: '_blank', rel: 'noopener noreferrer', class: 'preview-link' }, 'link');
    row.querySelector('.preview')?.remove();
    row.append(h('span', { class: 'preview muted' }, ' ', link, ` (works until ${fmtTime(preview.expires_at)}; share it to show the app)`));
  }

  async function refresh() {
    err.show(null);
    look.disabled = true;
    status.replaceChildren('looking…');
    try {
      const { ports, previews } = await api('GET', `${base}/ports`, { signal });
      list.replaceChildren(...ports.map((p) => {
        const row = h('li', { 'data-port': String(p.port) }, h('code', {}, `${p.address}:${p.port}`));
        if (!previews) {
          row.append(h('span', { class: 'muted' }, ' (previews are off on this server)'));
        } else if (p.previewable) {
          const b = h('button', { type: 'button', class: 'secondary preview-open' }, 'Open');
          b.addEventListener('click', () => open(p.port, row));
          row.append(' ', b);
        } else {
          row.append(h('span', { class: 'muted' }, ' (listens on this address alone: serve on 127.0.0.1 or 0.0.0.0 to preview it)'));
        }
        return row;
      }));
      status.replaceChildren(ports.length ? '' : 'nothing listens yet');
    } catch (e) {
      status.replaceChildren();
      if (!signal.aborted) err.show(e);
    }
    look.disabled = false;
  }
  look.addEventListener('click', refresh);
  status.replaceChildren('what listens in the sandbox shows here');
  const el = h('section', { class: 'ports-panel', hidden: true },
    h('div', { class: 'toolbar' }, h('h2', {}, 'Ports'), status, h('span', { class: 'spacer' }), look), err, list);
  return { el, refresh };
}

async function jobPage(main, id, signal) {
  const err = errorBox();
  const state = h('span');
  const cancel = h('button', { type: 'button', class: 'danger', hidden: true }, 'Cancel');
  const lab = labControl(`v1/jobs/${encodeURIComponent(id)}/lab`, signal);
  lab.el.hidden = true;
  const facts = h('dl', { class: 'facts' });
  const live = h('span', { class: 'muted live' });
  const output = h('pre', { class: 'output' });
  const scroll = follow(output);
  const request = h('pre');
  const result = h('pre');
  const resultBox = h('details', { hidden: true }, h('summary', {}, 'Result'), result);
  // A gui job's screenshots, one per computer step, in order.
  const strip = h('div', { class: 'shots' });
  const shotsBox = h('section', { hidden: true }, h('h2', {}, 'Screenshots'), strip);
  const shown = new Set();
  main.append(
    h('div', { class: 'toolbar' }, h('h1', {}, id), state, live, h('span', { class: 'spacer' }), lab.el, cancel),
    err, lab.err, facts,
    h('details', {}, h('summary', {}, 'Request'), request),
    resultBox, shotsBox);

  async function showShots(steps) {
    // An agent job's `steps` is a count, not a list.
    if (!Array.isArray(steps)) return;
    for (const step of steps) {
      const path = step.screenshot;
      if (typeof path !== 'string' || shown.has(path)) continue;
      shown.add(path);
      try {
        const resp = await api('GET', `v1/jobs/${encodeURIComponent(id)}/files/${enc(path)}`, { signal, raw: true });
        const url = URL.createObjectURL(await resp.blob());
        strip.append(h('figure', {},
          h('img', { src: url, alt: `step ${step.index + 1}: ${path}` }),
          h('figcaption', { class: 'muted' }, `step ${step.index + 1}`)));
        shotsBox.hidden = false;
      } catch (e) { if (!signal.aborted) err.show(e); }
    }
  }

  let job;
  async function refresh() {
    job = await api('GET', `v1/jobs/${encodeURIComponent(id)}`, { signal });
    state.replaceChildren(badge(job.state));
    cancel.hidden = !['queued', 'running'].includes(job.state);
    // Only a running job has a sandbox for a Lab.
    lab.el.hidden = job.state !== 'running';
    const rows = [['kind', job.kind], ['created', fmtTime(job.created_at)], ['started', fmtTime(job.started_at)],
      ['finished', fmtTime(job.finished_at)], ['duration', durationOf(job)],
      ['exit code', job.exit_code ?? '—']];
    if (job.error) rows.push(['error', job.error]);
    facts.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k),
      h('dd', { class: k === 'error' ? 'error-text' : '' }, v instanceof Node ? v : String(v))]));
    request.textContent = readable(JSON.stringify(job.request, null, 2));
    resultBox.hidden = job.result == null;
    result.textContent = readable(JSON.stringify(job.result, null, 2));
    showShots(job.result?.steps);
  }
  try { await refresh(); } catch (e) { err.show(e); return; }

  cancel.addEventListener('click', async () => {
    cancel.disabled = true;
    try { await api('POST', `v1/jobs/${encodeURIComponent(id)}/cancel`, { signal }); await refresh(); } catch (e) { err.show(e); }
    cancel.disabled = false;
  });

  let transcript = null;
  if (job.kind === 'agent') {
    const box = h('div', { class: 'transcript' });
    main.append(h('h2', {}, 'Agent'), box);
    transcript = new Transcript(box);
    transcript.user(job.request.prompt);
  }
  // An agent job's work shows in its transcript; output appears only if some comes.
  const outputBox = h('div', { class: 'stack', hidden: job.kind === 'agent' },
    h('h2', {}, 'Output'), output);
  main.append(outputBox);
  const ports = portsPanel(`v1/jobs/${encodeURIComponent(id)}`, signal);
  outputBox.before(ports.el);
  const showPorts = () => {
    const running = job.state === 'running';
    if (running && ports.el.hidden) ports.refresh();
    ports.el.hidden = !running;
  };
  showPorts();
  const files = filesPanel(id, signal);
  main.append(files.el);

  // A desktop appears while the job runs with a display.
  let desktop = null;
  const showDesktop = () => {
    if (job.live_desktop && !desktop) {
      desktop = desktopPanel(id, signal);
      outputBox.before(desktop.el);
      desktop.connect();
    } else if (desktop && !['queued', 'running'].includes(job.state)) {
      desktop.end();
    }
  };
  showDesktop();

  // Consecutive output of one stream goes into one text node.
  let last = null;
  const write = (cls, text) => {
    if (!last || last.cls !== cls) {
      last = { cls, node: document.createTextNode('') };
      outputBox.hidden = false;
      output.append(h('span', { class: cls }, last.node));
    }
    last.node.appendData(readable(text));
    scroll();
  };
  const marker = (text) => {
    last = null;
    output.append(h('span', { class: 'marker' }, `${text}\n`));
    scroll();
  };

  const onEvent = ({ event, data }) => {
    if (event === 'stdout' || event === 'stderr') write(event, data.data);
    else if (event === 'output_truncated') marker(`[${data.stream} truncated at ${fmtSize(data.cap_bytes)}]`);
    else if (event === 'step_started') {
      marker(`▸ step ${data.index + 1}: ${data.tool}`);
      // The desktop is up before the first step: show it if not yet shown.
      if (!desktop && job.request?.display) refresh().then(showDesktop).catch((e) => err.show(e));
    }
    else if (event === 'step_finished') marker(`  ${data.state}${data.exit_code == null ? '' : ` (exit ${data.exit_code})`} in ${fmtDuration(data.duration_ms)}`);
    else if (event === 'state' || event === 'finished') {
      refresh().then(() => { showDesktop(); showPorts(); }).catch((e) => err.show(e));
    }
    else if (transcript && data && typeof data === 'object' && data.type) transcript.handle(data);
    if (event === 'finished') files.load();
  };
  try {
    await followJob(id, onEvent, (s) => { live.textContent = s; }, signal);
    live.textContent = '';
    transcript?.settle();
  } catch (e) {
    if (!signal.aborted) err.show(e);
  }
}

async function chat(main, sessionId, signal) {
  const err = errorBox();
  const list = h('ul', { class: 'sessions' });
  const model = h('input', { placeholder: 'model (server default)', 'aria-label': 'model' });
  const create = h('button', { type: 'button' }, 'New session');
  const convo = h('section', { class: 'conversation' });
  main.append(h('div', { class: 'chat' },
    h('aside', {}, create, model, err, list),
    convo));

  async function loadSessions() {
    const { sessions } = await api('GET', 'v1/sessions', { signal });
    list.replaceChildren(...sessions.map((s) => h('li', { class: s.id === sessionId ? 'current' : '' },
      h('a', { href: `#/chat/${s.id}` }, s.title || '(new session)'),
      h('span', { class: 'muted' }, `${fmtTime(s.created_at)} · ${s.model}`))));
    if (!sessions.length) list.append(h('li', { class: 'muted' }, 'No sessions yet.'));
  }
  loadSessions().catch((e) => err.show(e));

  create.addEventListener('click', async () => {
    err.show(null);
    try {
      const body = model.value.trim() ? { model: model.value.trim() } : {};
      const s = await api('POST', 'v1/sessions', { body, signal });
      location.hash = `#/chat/${s.id}`;
    } catch (e) { err.show(e); }
  });

  if (!sessionId) {
    convo.append(h('p', { class: 'muted empty' }, 'Pick a session, or start a new one.'));
    return;
  }

  const title = h('h1', {});
  const lab = labControl(`v1/sessions/${encodeURIComponent(sessionId)}/lab`, signal);
  const box = h('div', { class: 'transcript' });
  const input = h('textarea', { rows: 3, placeholder: 'Message the agent (Enter sends, Shift+Enter for a new line)', 'aria-label': 'message' });
  const send = h('button', { type: 'submit' }, 'Send');
  const stop = h('button', { type: 'button', class: 'danger', hidden: true }, 'Stop');
  const sendErr = errorBox();
  const composer = h('form', { class: 'composer' }, input, h('div', { class: 'buttons' }, send, stop));
  const ports = portsPanel(`v1/sessions/${encodeURIComponent(sessionId)}`, signal);
  ports.el.hidden = false;
  convo.append(h('div', { class: 'toolbar' }, title, h('span', { class: 'spacer' }), lab.el), lab.err, box, sendErr, composer, ports.el);
  const transcript = new Transcript(box);
  let busy = false;

  try {
    const s = await api('GET', `v1/sessions/${encodeURIComponent(sessionId)}`, { signal });
    title.textContent = s.title || '(new session)';
    transcript.history(s.messages || [], s.labels || {});
    transcript.settle();
  } catch (e) { sendErr.show(e); return; }
  input.focus();

  async function say() {
    const text = input.value;
    if (busy || !text.trim()) return;
    busy = true;
    send.disabled = true;
    stop.hidden = false;
    sendErr.show(null);
    let ended = false;
    // Shown at once; taken back if the server refuses the message.
    transcript.user(text);
    const mine = box.lastElementChild;
    input.value = '';
    try {
      let r;
      try {
        r = await api('POST', `v1/sessions/${encodeURIComponent(sessionId)}/messages`, { body: { text }, raw: true, signal });
      } catch (e) {
        mine.remove();
        input.value = text;
        throw e;
      }
      await readEvents(r, ({ data }) => {
        if (data?.type === 'turn_completed' || data?.type === 'error') ended = true;
        transcript.handle(data);
      });
      if (!ended) transcript.note('The connection closed before the turn ended; it goes on on the server. Reopen the session to see it.', 'bad');
    } catch (e) {
      if (!signal.aborted) sendErr.show(e);
    } finally {
      transcript.settle();
      busy = false;
      send.disabled = false;
      stop.hidden = true;
      if (!title.textContent || title.textContent === '(new session)') title.textContent = oneLine(text, 72);
      loadSessions().catch(() => {});
      // A turn may have started a server: its port shows.
      ports.refresh();
    }
  }

  composer.addEventListener('submit', (e) => { e.preventDefault(); say(); });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      say();
    }
  });
  stop.addEventListener('click', async () => {
    try { await api('POST', `v1/sessions/${encodeURIComponent(sessionId)}/cancel`, { signal }); } catch (e) { sendErr.show(e); }
  });
}

// ---- routing ----------------------------------------------------------------

let current = null; // the shown view's AbortController: leaving a view stops its streams and polls

// The images this tenant may run in: the operator's and its own, which
// it may delete; a build's log is its job's page.
function imagesPage(main, signal) {
  const err = errorBox();
  const offered = h('tbody');
  const own = h('tbody');
  const quota = h('p', { class: 'muted' });
  main.append(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Images'), h('span', { class: 'spacer' }),
      h('a', { class: 'button', href: '#/new' }, 'Build one (a build job)')),
    err,
    h('h2', {}, 'Offered by this server'),
    h('table', { class: 'images' },
      h('thead', {}, h('tr', {}, ['name', 'default', 'digest', 'size'].map((c) => h('th', {}, c)))), offered),
    h('h2', {}, 'Yours'),
    quota,
    h('table', { class: 'images own' },
      h('thead', {}, h('tr', {}, ['name', 'from', 'digest', 'size', 'created', ''].map((c) => h('th', {}, c)))), own));
  const short = (d) => (d ? d.replace(/^sha256:/, '').slice(0, 12) : '');
  const origin = (o) => {
    if (o.built) return h('a', { href: `#/jobs/${o.built}` }, 'build');
    if (o.snapshot) return `snapshot of ${o.snapshot}`;
    return `pull of ${o.pulled}`;
  };
  async function load() {
    const list = await api('GET', 'v1/images', { signal });
    offered.replaceChildren(...list.images.map((i) => h('tr', {},
      h('td', {}, i.name), h('td', {}, i.default ? 'yes' : ''),
      h('td', { class: 'mono', title: i.stored?.digest ?? '' }, short(i.stored?.digest)),
      h('td', {}, i.stored ? fmtSize(i.stored.size) : 'not pulled yet'))));
    if (!list.images.length) offered.append(h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'None: jobs run on the host\'s root.')));
    own.replaceChildren(...list.own.map((i) => {
      const del = h('button', { type: 'button', class: 'secondary' }, 'Delete');
      del.addEventListener('click', async () => {
        if (!confirm(`Delete the image ${i.name}?`)) return;
        try { await api('DELETE', `v1/images/${enc(i.name)}`, { raw: true }); await load(); } catch (e) { err.show(e); }
      });
      return h('tr', {}, h('td', {}, i.name), h('td', {}, origin(i.origin)),
        h('td', { class: 'mono', title: i.digest }, short(i.digest)), h('td', {}, fmtSize(i.size)),
        h('td', {}, fmtTime(new Date(i.created_ms).toISOString())), h('td', {}, del));
    }));
    if (!list.own.length) own.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'None yet: build one with a job of kind build.')));
    quota.textContent = `${fmtSize(list.quota.used)} in use` + (list.quota.limit ? ` of ${fmtSize(list.quota.limit)}` : '');
  }
  return load().catch((e) => err.show(e));
}

function route() {
  current?.abort();
  current = new AbortController();
  const { signal } = current;
  const main = $('#main');
  main.replaceChildren();
  main.className = '';
  const signedIn = !!auth.get();
  $('#top').hidden = !signedIn;
  if (!signedIn) return signIn(main);
  const [page, id] = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  for (const a of document.querySelectorAll('[data-nav]')) {
    a.classList.toggle('active', a.dataset.nav === (page || 'jobs'));
  }
  main.className = `page-${page || 'jobs'}`;
  const done = (p) => Promise.resolve(p).catch((e) => {
    if (!signal.aborted) main.append(h('p', { class: 'error' }, e.message));
  });
  if (!page || page === 'jobs') return done(id ? jobPage(main, id, signal) : jobList(main, signal));
  if (page === 'new') return done(newJob(main));
  if (page === 'chat') return done(chat(main, id, signal));
  if (page === 'images') return done(imagesPage(main, signal));
  main.append(h('p', { class: 'error' }, 'No such page. '), h('a', { href: '#/jobs' }, 'Back to the jobs'));
}

$('#sign-out').addEventListener('click', () => {
  auth.clear();
  route();
});
window.addEventListener('hashchange', route);
route();
