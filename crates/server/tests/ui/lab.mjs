// JupyterLab from the web UI in headless Chromium: a running job's "Open
// Lab" opens the Lab in a new tab on the Lab's own origin, a notebook cell
// writes a file in the job's workspace, and the files API finds it; a
// session's "Open Lab" does the same for the session's sandbox. The API's
// error reaches the page as text, and the Lab's tab gets no handle on the
// UI's page, nor the token.
// Run by crates/server/tests/suite/ui.rs with BASE_URL, TOKEN, CHROMIUM,
// PLAYWRIGHT_CORE and JOB_ID (a running shell job) set.

import assert from 'node:assert/strict';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

const { JOB_ID } = process.env;
if (!JOB_ID) throw new Error('JOB_ID is not set');
const shot = shooter('lab-');
const origin = new URL(BASE_URL).origin;

// Markup in an error message (it can carry bytes from the sandbox).
const HOSTILE = '<img src=x onerror="window.pwned=1">Jupyter said <b>no</b>';

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  context.setDefaultTimeout(60000);
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(`console: ${m.text()}`);
  });
  // Every request of every tab: the token goes to the server's origin only,
  // and only as a header.
  const leaks = [];
  context.on('request', (r) => {
    const auth = r.headers().authorization;
    if (r.url().includes(TOKEN)) leaks.push(`token in a URL: ${r.url()}`);
    if (auth && new URL(r.url()).origin !== origin) leaks.push(`token sent to ${r.url()}`);
  });

  step('sign in and open the running job');
  await page.goto(`${BASE_URL}/`);
  await page.fill('input[name=token]', TOKEN);
  await page.click('form.sign-in button[type=submit]');
  await page.locator('table.jobs').waitFor();
  await page.goto(`${BASE_URL}/#/jobs/${JOB_ID}`);
  await page.locator('.toolbar .badge.state-running').waitFor();
  const open = page.locator('button.lab-open');
  await open.waitFor();

  step('an error from the API shows as text, and the blank tab closes');
  await page.route('**/lab', (route) => route.fulfill({
    status: 503,
    contentType: 'application/json',
    body: JSON.stringify({ error: { code: 'lab_unavailable', message: HOSTILE } }),
  }), { times: 1 });
  const [blank] = await Promise.all([context.waitForEvent('page'), open.click()]);
  await page.locator('.lab-error', { hasText: 'Jupyter said' }).waitFor();
  assert.equal(await page.textContent('.lab-error'), HOSTILE);
  assert.equal(await page.locator('.lab-error img, .lab-error b').count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  if (!blank.isClosed()) await blank.waitForEvent('close', { timeout: 5000 });
  assert.equal(await open.isDisabled(), false);
  await shot(page, 'job-error');
  await page.unroute('**/lab');

  step('Open Lab: progress, then JupyterLab in a new tab on its own origin');
  const posts = [];
  page.on('request', (r) => { if (r.method() === 'POST' && r.url().endsWith('/lab')) posts.push(r); });
  const [lab] = await Promise.all([context.waitForEvent('page'), open.click()]);
  lab.on('pageerror', (e) => console.log(`(the Lab's page: ${e.message})`));
  await page.locator('.lab-status', { hasText: /starting JupyterLab|opened/ }).waitFor();
  await page.locator('.lab-status', { hasText: 'opened in a new tab' }).waitFor({ timeout: 300000 });
  assert.equal(await page.textContent('.lab-error'), '');
  await shot(page, 'job-opened');
  assert.equal(posts.length, 1);
  assert.equal(posts[0].headers().authorization, `Bearer ${TOKEN}`);
  const card = lab.locator('.jp-LauncherCard[data-category="Notebook"]').first();
  await card.waitFor({ timeout: 120000 });
  const url = new URL(lab.url());
  assert.notEqual(url.origin, origin, 'the Lab runs on an origin of its own');
  assert.equal(url.pathname, `/v1/jobs/${JOB_ID}/lab/lab`);
  assert.equal(url.searchParams.get('cordon_ticket'), null, 'the ticket is spent and gone');
  assert.equal(await lab.evaluate(() => window.opener), null, 'the Lab has no handle on the UI');
  // JupyterLab keeps its own state there; the UI's token is not there.
  const stored = await lab.evaluate(() => JSON.stringify([{ ...localStorage }, { ...sessionStorage }]));
  assert.ok(!stored.includes(TOKEN), 'the token is in the Lab origin\'s storage');
  await shot(lab, 'launcher');

  step('a notebook cell writes a file in the workspace and prints');
  await card.click();
  const editor = lab.locator('.jp-Notebook .jp-Cell .jp-InputArea-editor').first();
  await kernelConnected(lab);
  // The page's own session has the kernel once its status bar names it.
  await lab.locator('.jp-StatusBar-TextItem', { hasText: /\| Idle$/ }).waitFor({ timeout: 120000 });
  await editor.click();
  const code = "import os; open('from-browser.txt', 'w').write('hello from the Lab'); print('cwd', os.getcwd(), 6 * 7)";
  await lab.keyboard.type(code);
  assert.equal(await editor.locator('.cm-content').textContent(), code);
  await lab.keyboard.press('Shift+Enter');
  await cellRan(lab);
  await lab.locator('.jp-OutputArea-output', { hasText: 'cwd /workspace 42' }).waitFor({ timeout: 120000 });
  await shot(lab, 'cell');

  step('the files API has the file');
  const r = await fetch(`${BASE_URL}/v1/jobs/${JOB_ID}/files/from-browser.txt`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  assert.equal(r.status, 200);
  assert.equal(await r.text(), 'hello from the Lab');
  await lab.close();

  step('a session\'s Lab; its tab closed before the URL came, the page offers a link');
  await page.click('a[data-nav=chat]');
  await page.click('.chat aside button');
  await page.waitForURL(/#\/chat\/ses/);
  const sessionId = decodeURIComponent(page.url().split('/').pop());
  const sessionOpen = page.locator('.conversation button.lab-open');
  await sessionOpen.waitFor();
  // As if the user closed the blank tab, or a popup blocker refused it.
  const opening = context.waitForEvent('page');
  await page.route('**/lab', async (route) => {
    await (await opening).close();
    await route.continue();
  }, { times: 1 });
  await sessionOpen.click();
  const link = page.locator('.conversation a.lab-link');
  await link.waitFor({ timeout: 300000 });
  assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
  await shot(page, 'session-link');
  const [sessionLab] = await Promise.all([context.waitForEvent('page'), link.click()]);
  // The link is spent: it goes.
  await page.locator('.conversation .lab-status', { hasText: 'opened in a new tab' }).waitFor();
  await sessionLab.locator('.jp-LauncherCard[data-category="Notebook"]').first().waitFor({ timeout: 120000 });
  assert.equal(new URL(sessionLab.url()).pathname, `/v1/sessions/${sessionId}/lab/lab`);
  assert.equal(await sessionLab.evaluate(() => window.opener), null);
  await sessionLab.close();

  assert.deepEqual(leaks, []);
  assert.deepEqual(problems, []);
  step('all good');
} catch (e) {
  // What each Lab tab knew when it failed: the kernel as Jupyter and as
  // the page see it, and the end of Jupyter's log.
  for (const p of browser.contexts().flatMap((c) => c.pages())) {
    if (!p.url().includes('/lab/lab')) continue;
    const state = await Promise.race([
      labState(p).catch((err) => `cannot read it: ${err.message}`),
      new Promise((resolve) => setTimeout(() => resolve('no answer in 20 s'), 20000)),
    ]);
    // JSON: the log is the sandbox's bytes, printed escaped.
    console.log(`(the Lab at ${p.url()}: ${JSON.stringify(state, null, 1)})`);
  }
  // What every tab showed when it failed, to look at.
  if (process.env.SCREENSHOTS) {
    for (const [i, p] of browser.contexts().flatMap((c) => c.pages()).entries()) {
      await p.screenshot({ path: `${process.env.SCREENSHOTS}/lab-failed-${i}.png` }).catch(() => {});
    }
  }
  throw e;
} finally {
  await browser.close();
}

// Waits until Jupyter runs the notebook's kernel, idle, with this page
// connected to it. The toolbar's indicator is no sign: it says "idle"
// before any kernel exists.
async function kernelConnected(lab) {
  await lab.waitForFunction(async () => {
    const base = JSON.parse(document.getElementById('jupyter-config-data').textContent).baseUrl;
    const r = await fetch(`${base}api/kernels`);
    if (!r.ok) return false;
    const kernels = await r.json();
    return kernels.length === 1 && kernels[0].execution_state === 'idle' && kernels[0].connections > 0;
  }, null, { polling: 500, timeout: 120000 });
}

// Waits until the first cell has been sent to the kernel: its prompt turns
// from "[ ]:" to "[*]:" or "[1]:". JupyterLab runs a cell only when the
// page's session already holds its kernel object; before that, Shift+Enter
// moves on and clears the prompt without a word (twice in ~40 CI runs, with
// Jupyter's kernel idle and connected and no message ever reaching it). So
// a prompt still blank after a while is run once more, and said. A request
// lost on the way (cordon's proxy) would leave "[*]:" and is not retried.
async function cellRan(lab) {
  const prompt = lab.locator('.jp-Notebook .jp-Cell').first().locator('.jp-InputPrompt');
  const sent = async (timeout) => lab.waitForFunction(
    (el) => el.textContent.trim() !== '[ ]:', await prompt.elementHandle(), { polling: 200, timeout },
  ).then(() => true, () => false);
  if (await sent(15000)) return;
  console.log('(the first cell was not sent to the kernel; running it again)');
  await lab.locator('.jp-Notebook .jp-Cell').first().locator('.jp-InputArea-editor').click();
  await lab.keyboard.press('Control+Enter');
  assert.ok(await sent(30000), 'the first cell was never sent to the kernel');
}

// A Lab page's view of its kernel, and the end of the Jupyter server's
// log (read through a Jupyter terminal: it is in the sandbox's /tmp).
function labState(p) {
  return p.evaluate(async () => {
    const base = JSON.parse(document.getElementById('jupyter-config-data').textContent).baseUrl;
    const get = async (u) => {
      try {
        const r = await fetch(base + u);
        return `${r.status} ${await r.text()}`;
      } catch (err) {
        return String(err);
      }
    };
    const text = (sel) => [...document.querySelectorAll(sel)].map((el) => el.textContent.trim());
    const xsrf = (document.cookie.split('; ').find((c) => c.startsWith('_xsrf=')) || '').slice(6);
    let log = '';
    try {
      const r = await fetch(`${base}api/terminals`, {
        method: 'POST', headers: { 'X-XSRFToken': decodeURIComponent(xsrf) },
      });
      const { name } = await r.json();
      const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
      const ws = new WebSocket(`${scheme}://${location.host}${base}terminals/websocket/${name}`);
      await new Promise((resolve) => {
        ws.onopen = () => ws.send(JSON.stringify(['stdin', 'tail -n 80 /tmp/.cordon-lab/log; exit\r']));
        ws.onmessage = (m) => {
          const [kind, data] = JSON.parse(m.data);
          if (kind === 'stdout') log += data;
        };
        ws.onclose = resolve;
        ws.onerror = resolve;
        setTimeout(resolve, 8000);
      });
    } catch (err) {
      log += `(no terminal: ${err})`;
    }
    return {
      indicator: document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status,
      statusbar: text('.jp-StatusBar-TextItem'),
      prompts: text('.jp-InputPrompt'),
      sources: text('.jp-Cell .cm-content'),
      outputs: text('.jp-OutputArea-output'),
      dialogs: text('.jp-Dialog'),
      kernels: await get('api/kernels'),
      sessions: await get('api/sessions'),
      log,
    };
  });
}
