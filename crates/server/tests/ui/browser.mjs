// Drives cordon's web UI in headless Chromium, as a person would: sign in,
// run a shell job and watch its output arrive while it runs, use its files,
// then chat with the (scripted) agent and open one of its tool calls.
// Run by crates/server/tests/suite/ui.rs with BASE_URL, TOKEN, CHROMIUM and
// PLAYWRIGHT_CORE (the playwright-core package directory) set.

import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import net from 'node:net';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

// A picture of each whole page.
const shot = shooter('', { fullPage: true });

// The browser reaches the server through this proxy, which can cut every
// connection at once: a network drop in the middle of a stream.
const upstream = new URL(BASE_URL);
const sockets = new Set();
const proxy = net.createServer((client) => {
  const server = net.connect(Number(upstream.port), upstream.hostname);
  for (const [a, b] of [[client, server], [server, client]]) {
    sockets.add(a);
    a.pipe(b);
    a.on('close', () => { sockets.delete(a); b.destroy(); });
    a.on('error', () => b.destroy());
  }
});
await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));
const base = `http://127.0.0.1:${proxy.address().port}`;
const dropConnections = () => { for (const s of sockets) s.destroy(); };

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  // The tests run as root, where Chromium's own sandbox cannot start; the
  // rest keeps it from reaching for the network, which is closed here.
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});

// The chat's last answer (ui.rs scripts it): Markdown as elements, its
// HTML as text, only its http(s) link an anchor, opened apart.
async function checkMarkdown(page) {
  const answer = page.locator('.msg.assistant', { hasText: 'so all is well.' });
  await answer.waitFor();
  assert.equal(await answer.locator('h4').textContent(), 'Done');
  assert.equal(await answer.locator('strong').textContent(), 'tool-said-42');
  assert.equal(await answer.locator('p code').first().textContent(), 'missing.txt');
  assert.equal(await answer.locator('pre.code code').textContent(), 'echo tool-said-$((6 * 7))');
  assert.deepEqual(await answer.locator('li').allTextContents(), ['first point', 'second point']);
  const links = await answer.locator('a').evaluateAll((as) =>
    as.map((a) => [a.getAttribute('href'), a.target, a.rel, a.textContent]));
  assert.deepEqual(links, [['https://example.com/docs', '_blank', 'noopener noreferrer nofollow', 'the docs']]);
  const text = await answer.textContent();
  assert.ok(text.includes('[this](javascript:alert(1))'), text);
  assert.ok(text.includes('<img src=x onerror="window.pwned=1">'), text);
  assert.ok(text.includes('<script>window.pwned=2</script>'), text);
  assert.equal(await page.locator('.transcript img, .transcript script, .transcript iframe').count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
}

try {
  const page = await browser.newPage({ viewport: { width: 1366, height: 768 } });
  page.setDefaultTimeout(20000);
  // Script errors and CSP violations fail the test; a refused request
  // (the wrong token below) is expected.
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(`console: ${m.text()}`);
  });

  step('sign in: a wrong token shows the API\'s error, the right one the jobs');
  await page.goto(`${base}/`);
  await page.fill('input[name=token]', 'not-a-token');
  await page.click('form.sign-in button[type=submit]');
  await page.getByText('unknown token').waitFor();
  await shot(page, 'sign-in');
  await page.fill('input[name=token]', TOKEN);
  await page.click('form.sign-in button[type=submit]');
  await page.locator('table.jobs').waitFor();
  const docs = await page.getAttribute('#api-docs', 'href');
  if (new URL(docs, page.url()).pathname !== '/docs') throw new Error(`the API link goes to ${docs}`);

  step('the form offers the kinds the API document lists, and writes a kind it has no form for as JSON');
  const doc = await (await fetch(`${BASE_URL}/openapi.json`)).json();
  await page.click('a[data-nav=new]');
  await page.locator('select[name=kind] option').first().waitFor({ state: 'attached' });
  assert.deepEqual(await page.locator('select[name=kind] option').evaluateAll((os) => os.map((o) => o.value)),
    doc.components.schemas.JobKind.enum);
  // A kind this page has never heard of: the server's document gains one.
  await page.route('**/openapi.json', async (route) => {
    const response = await route.fetch();
    const json = await response.json();
    json.components.schemas.JobKind.enum.push('echo');
    json.paths['/v1/jobs'].post.requestBody.content['application/json'].examples.echo =
      { summary: 'Text, printed', value: { kind: 'echo', text: 'hi', timeout_secs: 5 } };
    await route.fulfill({ response, json });
  });
  let posted = null;
  await page.route('**/v1/jobs', async (route) => {
    if (route.request().method() !== 'POST') return route.fallback();
    posted = route.request().postDataJSON();
    await route.fulfill({ status: 400, json: { error: { code: 'bad_request', message: 'no echo here' } } });
  });
  await page.reload();
  await page.click('a[data-nav=new]');
  await page.selectOption('select[name=kind]', 'echo');
  // The example's own fields, without those the form has inputs for.
  assert.deepEqual(JSON.parse(await page.inputValue('textarea[name=fields]')), { text: 'hi' });
  await page.fill('textarea[name=fields]', '["not", "an object"]');
  await page.click('form.job-form button[type=submit]');
  await page.getByText('The fields must be a JSON object').waitFor();
  assert.equal(posted, null);
  await page.fill('textarea[name=fields]', '{"text": "hello", "kind": "shell"}');
  await page.fill('input[name=timeout_secs]', '7');
  await page.click('form.job-form button[type=submit]');
  await page.getByText('no echo here').waitFor();
  assert.deepEqual(posted, { kind: 'echo', text: 'hello', timeout_secs: 7, network: 'off' });
  await page.unrouteAll();
  await page.reload();

  step('submit a shell job');
  await page.click('a[data-nav=new]');
  await page.selectOption('select[name=kind]', 'shell');
  await page.fill('textarea[name=command]',
    'for i in 1 2 3; do echo tick-$i; sleep 0.5; done; echo made > out.txt; mkdir sub; echo inner > sub/in.txt; '
    // A right-to-left override (U+202E, in UTF-8) in a name and in output.
    + ": > \"$(printf 'report\\342\\200\\256txt.exe')\"; printf 'warn \\342\\200\\256gnp.exe\\n' >&2");
  await shot(page, 'new-job');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  const jobId = decodeURIComponent(page.url().split('/').pop());

  step('its output arrives while it runs');
  await page.waitForFunction(() => document.querySelector('pre.output')?.textContent.includes('tick-1'));
  const early = await page.evaluate(() => ({
    out: document.querySelector('pre.output').textContent,
    state: document.querySelector('.toolbar .badge')?.textContent,
  }));
  assert.ok(!early.out.includes('tick-3'), `tick-1 came with tick-3, not live: ${JSON.stringify(early)}`);
  assert.ok(['queued', 'running'].includes(early.state), `the job had already ended: ${JSON.stringify(early)}`);

  step('then it succeeds, with stdout and stderr told apart');
  await page.locator('.toolbar .badge.state-succeeded').waitFor();
  assert.equal(await page.textContent('pre.output .stdout'), 'tick-1\ntick-2\ntick-3\n');
  // The override is shown, not obeyed: the text reads in the order it is.
  assert.equal(await page.textContent('pre.output .stderr'), 'warn \uFFFDgnp.exe\n');
  assert.match(await page.textContent('dl.facts'), /exit code\s*0/);

  step('its workspace: the file it wrote, an upload, a preview, a download');
  await page.locator('.files td', { hasText: 'out.txt' }).waitFor();
  await page.locator('.files td', { hasText: 'report\uFFFDtxt.exe' }).waitFor();
  const reordering = await page.evaluate(() => {
    const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const found = [];
    while (walk.nextNode()) if (/[\u202A-\u202E\u2066-\u2069]/.test(walk.currentNode.data)) found.push(walk.currentNode.data);
    return found;
  });
  assert.deepEqual(reordering, []);
  await page.setInputFiles('.files input[type=file]', {
    name: 'up <b>.txt', mimeType: 'text/plain', buffer: Buffer.from('<i>uploaded</i>\n'),
  });
  const row = page.locator('.files tr', { hasText: 'up <b>.txt' });
  await row.waitFor();
  await row.getByText('view').click();
  await page.locator('.preview pre', { hasText: '<i>uploaded</i>' }).waitFor();
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.locator('.files tr', { hasText: 'out.txt' }).getByText('download').click(),
  ]);
  assert.equal(download.suggestedFilename(), 'out.txt');
  assert.equal(await readFile(await download.path(), 'utf8'), 'made\n');

  step('images show as images; an SVG\'s script never runs');
  const png = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==', 'base64');
  const svg = Buffer.from('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20" onload="document.title=\'pwned\'">'
    + '<script>document.title=\'pwned\'</script><rect width="40" height="20" fill="teal"/></svg>');
  const title = await page.title();
  await page.setInputFiles('.files input[type=file]', [
    { name: 'dot.png', mimeType: 'image/png', buffer: png },
    { name: 'pic.svg', mimeType: 'image/svg+xml', buffer: svg },
  ]);
  for (const [name, width] of [['dot.png', 1], ['pic.svg', 40]]) {
    const r = page.locator('.files tr', { hasText: name });
    await r.waitFor();
    await r.getByText('view').click();
    await page.waitForFunction(([n, w]) => {
      const img = document.querySelector('.preview img');
      return img && !img.hidden && img.alt.endsWith(n) && img.complete && img.naturalWidth === w;
    }, [name, width]);
  }
  assert.equal(await page.title(), title, 'the SVG ran its script');
  await shot(page, 'image');

  step('a sub-folder\'s path and files');
  await page.locator('.files a.dir', { hasText: 'sub/' }).click();
  await page.locator('.files tr', { hasText: 'in.txt' }).waitFor();
  assert.equal((await page.textContent('.files .crumbs')).trim(), '/workspace/sub');
  await page.locator('.files tr', { hasText: 'in.txt' }).getByText('view').click();
  await page.locator('.preview pre', { hasText: 'inner' }).waitFor();
  await page.locator('.files .crumbs a', { hasText: '/workspace' }).click();
  await page.locator('.files tr', { hasText: 'out.txt' }).waitFor();
  await shot(page, 'job');

  step('the job list shows it');
  await page.click('a[data-nav=jobs]');
  await page.locator(`tr[data-id="${jobId}"] .badge.state-succeeded`).waitFor();
  await shot(page, 'jobs');
  await page.selectOption('select[aria-label=state]', 'failed');
  await page.getByText('No failed jobs.').waitFor();
  await page.selectOption('select[aria-label=state]', 'succeeded');
  await page.locator(`tr[data-id="${jobId}"]`).waitFor();
  await page.selectOption('select[aria-label=state]', '');

  step('a build job from the form; the Images page lists its image, the form offers it, and it can be deleted');
  await page.click('a[data-nav=new]');
  await page.selectOption('select[name=kind]', 'build');
  assert.ok(await page.locator('select[name=image]').isHidden(), 'a build offered an image to run in');
  await page.fill('input[name=name]', 'ui-env:1');
  await page.fill('textarea[name=dockerfile]', 'FROM scratch\nLABEL made.by=the-web-ui\n');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  await page.locator('.toolbar .badge.state-succeeded').waitFor();
  await page.locator('pre.output', { hasText: '[stage 1] FROM scratch' }).waitFor();
  await page.click('a[data-nav=images]');
  await page.locator('table.own tr', { hasText: 'ui-env:1' }).getByText('build').waitFor();
  await shot(page, 'images');
  await page.click('a[data-nav=new]');
  await page.locator('select[name=image] option[value="ui-env:1"]').waitFor({ state: 'attached' });
  await page.click('a[data-nav=images]');
  page.once('dialog', (d) => d.accept());
  await page.locator('table.own tr', { hasText: 'ui-env:1' }).getByText('Delete').click();
  await page.getByText('None yet').waitFor();

  step('a dropped connection resumes where it stopped');
  await page.click('a[data-nav=new]');
  await page.fill('textarea[name=command]', 'for i in $(seq 1 8); do echo line-$i; sleep 0.4; done');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  await page.waitForFunction(() => document.querySelector('pre.output')?.textContent.includes('line-2'));
  dropConnections();
  await page.locator('.live', { hasText: 'reconnecting' }).waitFor();
  await page.locator('.live', { hasText: 'live' }).waitFor();
  await page.locator('.toolbar .badge.state-succeeded').waitFor();
  assert.equal(await page.textContent('pre.output'),
    [1, 2, 3, 4, 5, 6, 7, 8].map((i) => `line-${i}\n`).join(''));

  step('cancel stops a running job');
  await page.click('a[data-nav=new]');
  await page.fill('textarea[name=command]', 'echo started; sleep 30');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  await page.locator('pre.output', { hasText: 'started' }).waitFor();

  step('a running job\'s duration keeps counting, on its page and in the list');
  const runningUrl = page.url();
  const ticks = async (selector) => {
    const first = await page.textContent(selector);
    await page.waitForFunction(([sel, was]) => document.querySelector(sel)?.textContent !== was,
      [selector, first], { timeout: 3000 });
  };
  await ticks('dl.facts dd [data-started]');
  await page.click('a[data-nav=jobs]');
  const runningId = decodeURIComponent(runningUrl.split('/').pop());
  await page.locator(`tr[data-id="${runningId}"] .badge.state-running`).waitFor();
  await ticks(`tr[data-id="${runningId}"] td.duration span`);

  step('the jobs list fits a phone\'s screen');
  const wide = page.viewportSize();
  await page.setViewportSize({ width: 390, height: 844 });
  const fits = await page.evaluate(() => {
    const t = document.querySelector('table.jobs').getBoundingClientRect();
    return t.left >= 0 && t.right <= window.innerWidth + 1
      && document.documentElement.scrollWidth <= window.innerWidth + 1;
  });
  await shot(page, 'jobs-phone');
  assert.ok(fits, 'the jobs table is cut off at phone width');
  await page.setViewportSize(wide);
  await page.goto(runningUrl);
  await page.locator('pre.output', { hasText: 'started' }).waitFor();
  await page.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('.toolbar .badge.state-cancelled').waitFor();
  await page.getByRole('button', { name: 'Cancel' }).waitFor({ state: 'hidden' });

  step('chat: a new session, a message sent with Enter');
  await page.click('a[data-nav=chat]');
  await page.getByRole('button', { name: 'New session' }).click();
  await page.waitForURL(/#\/chat\/ses_/);
  const box = page.locator('textarea[aria-label=message]');
  await box.waitFor();
  // Every length the answer's text takes on, to see it grow piece by piece.
  await page.evaluate(() => {
    window.lengths = [];
    const t = document.querySelector('.transcript');
    new MutationObserver(() => {
      const text = [...t.querySelectorAll('.msg.assistant')].map((e) => e.textContent).join('');
      if (window.lengths.at(-1) !== text.length) window.lengths.push(text.length);
    }).observe(t, { subtree: true, childList: true, characterData: true });
  });
  await box.fill('look at the workspace');
  await box.press('Enter');
  await page.locator('.msg.user', { hasText: 'look at the workspace' }).waitFor();

  step('a tool call: folded, named with its command, then its result');
  const bash = page.locator('details.tool', { hasText: 'echo tool-said' });
  await bash.waitFor();
  assert.equal(await bash.evaluate((d) => d.open), false, 'tool calls start folded');
  assert.equal(await bash.locator('.tool-name').textContent(), 'bash');
  await page.locator('details.tool.done', { hasText: 'echo tool-said' }).waitFor();
  await bash.locator('summary').click();
  const output = bash.locator('.tool-output');
  await output.waitFor({ state: 'visible' });
  assert.match(await output.textContent(), /tool-said-42/);
  const failed = page.locator('details.tool.failed', { hasText: 'read_file' });
  await failed.waitFor();
  await shot(page, 'chat-tool');

  step('the plan is shown above the conversation, its markup as text');
  const checkPlan = async () => {
    const plan = page.locator('section.plan');
    await plan.locator('li.in_progress').waitFor();
    assert.equal(await plan.locator('.label').textContent(), 'plan · 1 of 2 done');
    assert.deepEqual(await plan.locator('li').allTextContents(),
      ['✓look at the workspace', '▸report <b onmouseover=alert(1)>back</b>']);
    assert.equal(await plan.locator('b').count(), 0);
  };
  await checkPlan();

  step('the answer streams in, and the turn ends');
  await page.getByText('so all is well.').waitFor();
  await page.locator('.note.done-line').waitFor();
  const lengths = await page.evaluate(() => window.lengths);
  assert.ok(lengths.length >= 5, `the text arrived in ${lengths.length} pieces: ${lengths}`);
  assert.equal(await page.getByRole('button', { name: 'Stop' }).isHidden(), true);
  assert.equal(await page.getByRole('button', { name: 'Send' }).isEnabled(), true);

  step('the answer is Markdown, rendered without any of its HTML');
  await checkMarkdown(page);

  step('reloaded, the conversation is the same');
  await page.reload();
  await page.getByText('so all is well.').waitFor();
  await checkMarkdown(page);
  await page.locator('.msg.user', { hasText: 'look at the workspace' }).waitFor();
  await page.locator('details.tool.done', { hasText: 'echo tool-said' }).waitFor();
  await page.locator('details.tool.failed', { hasText: 'read_file' }).waitFor();
  await page.getByText('so all is well.').waitFor();
  await checkPlan();
  await page.locator('.sessions li.current', { hasText: 'look at the workspace' }).waitFor();
  await shot(page, 'chat');

  step('an agent job shows the agent\'s work as the chat does');
  await page.click('a[data-nav=new]');
  await page.selectOption('select[name=kind]', 'agent');
  await page.fill('textarea[name=prompt]', 'leave a note');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  // The command's output shows while it still runs (it sleeps after it).
  const running = page.locator('.transcript details.tool.running', { hasText: 'tee agent.txt' });
  await running.waitFor();
  await running.locator('summary').click();
  await page.waitForFunction(() => {
    const d = document.querySelector('.transcript details.tool.running');
    return d && /^agent-was-here/.test(d.querySelector('.tool-output').textContent);
  });
  await shot(page, 'agent-job-running');
  await page.locator('.transcript details.tool.done', { hasText: 'agent-was-here' }).waitFor();
  await page.locator('.transcript .msg.assistant', { hasText: 'Left agent.txt.' }).waitFor();
  await page.locator('.toolbar .badge.state-succeeded').waitFor();
  await page.locator('.files td', { hasText: 'agent.txt' }).waitFor();
  await shot(page, 'agent-job');

  assert.deepEqual(problems, []);
  step('all good');
} finally {
  await browser.close();
  proxy.close();
}
