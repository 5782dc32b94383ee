// /docs in headless Chromium, as a user of the API would: authorize with a
// tenant's token in Swagger UI, try POST /v1/jobs with a shell job, see the
// 202 and the job's id, and the job run. The page must talk to this origin
// only and break none of its Content-Security-Policy.
// Run by crates/server/tests/suite/ui.rs with BASE_URL, TOKEN, CHROMIUM and
// PLAYWRIGHT_CORE set.

import assert from 'node:assert/strict';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

const shot = shooter('docs-');

const api = async (p, body) => {
  const r = await fetch(`${BASE_URL}${p}`, {
    method: body ? 'POST' : 'GET',
    headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
    body: body && JSON.stringify(body),
  });
  assert.equal(r.status, body ? 202 : 200, `${p}: ${await r.clone().text()}`);
  return r.json();
};
const finished = async (jobId) => {
  for (let i = 0; i < 300; i++) {
    const job = await api(`/v1/jobs/${jobId}`);
    if (!['queued', 'running'].includes(job.state)) return job;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${jobId} did not finish`);
};

// Markup a sandboxed program controls, in its output and in its files:
// shown by the page, it must stay text.
const HOSTILE = '<img src=x onerror="window.pwned=\'img\'"><script>window.pwned=\'script\'</script>';
const HOSTILE_SVG = '<svg xmlns="http://www.w3.org/2000/svg" onload="window.pwned=\'svg\'"><script>window.pwned=\'svg-script\'</script></svg>';

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.setDefaultTimeout(20000);
  const origin = new URL(BASE_URL).origin;
  const problems = [];
  const elsewhere = [];
  const submits = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // A CSP violation is a console error ("Refused to ..."); so is any
    // other script failure.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(`console: ${m.text()}`);
  });
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol !== 'data:' && u.protocol !== 'blob:' && u.origin !== origin) elsewhere.push(r.url());
    if (r.method() === 'POST' && u.pathname === '/v1/jobs') submits.push(r);
  });
  // Violations of the policy as the page sees them, whether or not the
  // browser also logs them.
  await page.addInitScript(() => {
    window.cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) =>
      window.cspViolations.push(`${e.violatedDirective}: ${e.blockedURI}`));
  });

  step('/docs loads Swagger UI on /openapi.json');
  await page.goto(`${BASE_URL}/docs`);
  await page.locator('.swagger-ui .info .title', { hasText: 'cordon' }).waitFor();
  // An operation's block, by method and path (not by tag or operationId).
  const opFor = (method, p) => page.locator(`.opblock-${method}`, {
    has: page.locator(`.opblock-summary-path[data-path="${p}"]`),
  }).first();
  const op = opFor('post', '/v1/jobs');
  await op.waitFor();
  await shot(page, 'overview');

  step('authorize with the tenant\'s token');
  await page.click('.swagger-ui .auth-wrapper button.authorize');
  const dialog = page.locator('.swagger-ui .dialog-ux .modal-ux');
  await dialog.waitFor();
  await dialog.locator('input[type=text], input[type=password]').first().fill(TOKEN);
  await dialog.locator('.auth-btn-wrapper button.authorize').click();
  await dialog.locator('.auth-btn-wrapper button.btn-done, button.btn-done').first().waitFor();
  await shot(page, 'authorized');
  await dialog.locator('button.btn-done').click();
  await dialog.waitFor({ state: 'detached' });

  step('POST /v1/jobs: its body\'s schema, then try it out with a shell job');
  await op.locator('.opblock-summary').first().click();
  await op.locator('.opblock-section-request-body button.tablinks[data-name=model]').click();
  await op.locator('.opblock-section-request-body .model-box').first().waitFor();
  await op.locator('button.try-out__btn').click();
  await op.locator('.opblock-section-request-body button.tablinks[data-name=example]').click();
  await op.locator('textarea.body-param__text').fill(JSON.stringify({ kind: 'shell', command: 'echo from-docs' }));
  await op.locator('button.execute').click();

  step('the 202 and the job\'s id are on the page');
  const live = op.locator('.live-responses-table');
  await live.locator('.response-col_status', { hasText: '202' }).waitFor();
  const body = await live.locator('.response-col_description .highlight-code, .response-col_description pre').first().textContent();
  const jobId = body.match(/job_[0-9a-f]+/)?.[0];
  assert.ok(jobId, `no job id in the response body: ${body}`);
  assert.equal(submits.length, 1, 'one POST /v1/jobs');
  assert.equal(submits[0].headers().authorization, `Bearer ${TOKEN}`);
  await op.scrollIntoViewIfNeeded();
  await live.scrollIntoViewIfNeeded();
  await shot(page, 'executed');

  // The token is kept in the page, as the README says, not in storage.
  assert.equal(await page.evaluate(() => localStorage.length + sessionStorage.length), 0);

  step('the schemas at the foot of the page open');
  await page.locator('.swagger-ui section.models .models-control').click();
  const model = page.locator('.swagger-ui section.models article.json-schema-2020-12').first();
  await model.locator('.json-schema-2020-12-expand-deep-button').first().click();
  await model.locator('.json-schema-2020-12-property').first().waitFor();

  step('the Lab\'s routes are listed, for jobs and sessions, with what POST …/lab answers');
  for (const [method, p] of [['post', '/v1/jobs/{id}/lab'], ['get', '/v1/jobs/{id}/lab/{path}'],
    ['post', '/v1/sessions/{id}/lab'], ['get', '/v1/sessions/{id}/lab/{path}']]) {
    await opFor(method, p).waitFor();
  }
  const openLab = opFor('post', '/v1/jobs/{id}/lab');
  await openLab.locator('.opblock-summary').first().click();
  await openLab.locator('.opblock-description-wrapper', { hasText: 'one-time ticket' }).waitFor();
  await openLab.locator('.responses-wrapper', { hasText: 'expires_in' }).waitFor();
  await openLab.scrollIntoViewIfNeeded();
  await shot(page, 'lab-route');
  await openLab.locator('.opblock-summary').first().click();

  step('POST /schedule, tried out with its first example as it stands, is taken');
  const schedule = opFor('post', '/schedule');
  await schedule.locator('.opblock-summary').first().click();
  await schedule.locator('button.try-out__btn').click();
  await schedule.locator('button.execute').click();
  await schedule.locator('.live-responses-table .response-col_status', { hasText: '202' }).waitFor();
  await schedule.locator('.opblock-summary').first().click();

  step(`${jobId} runs and says from-docs`);
  const job = await finished(jobId);
  assert.equal(job.state, 'succeeded', JSON.stringify(job));
  assert.equal(job.stdout, 'from-docs\n');

  step('a job\'s hostile output and files, tried out, show as text and run nothing');
  const { id: evilId } = await api('/v1/jobs', {
    kind: 'steps',
    steps: [
      { tool: 'write_file', path: 'evil.html', content: `<html>${HOSTILE}</html>` },
      { tool: 'write_file', path: 'evil.svg', content: HOSTILE_SVG },
      { tool: 'shell', command: 'cat evil.html' },
    ],
  });
  assert.equal((await finished(evilId)).state, 'succeeded');
  const tryIt = async (o, params, shows) => {
    await o.locator('.opblock-summary').first().click();
    await o.locator('button.try-out__btn').click();
    for (const [name, value] of Object.entries(params)) {
      await o.locator(`tr[data-param-name="${name}"] input`).fill(value);
    }
    await o.locator('button.execute').click();
    const response = o.locator('.live-responses-table .response');
    await response.locator('.response-col_status', { hasText: '200' }).waitFor();
    await response.locator('.response-col_description', { hasText: shows }).waitFor();
  };
  // In the job's JSON, its stdout (quotes escaped); the file, as it is.
  await tryIt(opFor('get', '/v1/jobs/{id}'), { id: evilId }, "<script>window.pwned='script'</script>");
  const file = opFor('get', '/v1/jobs/{id}/files/{path}');
  await tryIt(file, { id: evilId, path: 'evil.html' }, HOSTILE);
  await file.locator('button.btn-clear').click();
  await file.locator('tr[data-param-name="path"] input').fill('evil.svg');
  await file.locator('button.execute').click();
  await file.locator('.live-responses-table .response-col_description', { hasText: 'svg' }).first().waitFor();
  await page.waitForTimeout(500);
  assert.equal(await page.evaluate(() => window.pwned), undefined, 'markup from the sandbox ran');
  await file.scrollIntoViewIfNeeded();
  await shot(page, 'hostile-file');

  problems.push(...(await page.evaluate(() => window.cspViolations)).map((v) => `csp: ${v}`));

  step('signed in to the web UI, its API link opens /docs already authorized');
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const signedIn = await context.newPage();
  signedIn.setDefaultTimeout(20000);
  signedIn.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  const listed = [];
  signedIn.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== origin && u.protocol !== 'data:' && u.protocol !== 'blob:') elsewhere.push(r.url());
    if (r.method() === 'GET' && u.pathname === '/v1/jobs') listed.push(r);
  });
  await signedIn.goto(`${BASE_URL}/`);
  await signedIn.fill('input[name=token]', TOKEN);
  await signedIn.click('form.sign-in button[type=submit]');
  await signedIn.locator('table.jobs').waitFor();
  await signedIn.click('#api-docs');
  await signedIn.waitForURL(/\/docs$/);
  await signedIn.locator('.swagger-ui .auth-wrapper button.authorize.locked').waitFor();
  const list = signedIn.locator('.opblock-get', {
    has: signedIn.locator('.opblock-summary-path[data-path="/v1/jobs"]'),
  }).first();
  listed.length = 0;
  await list.locator('.opblock-summary').first().click();
  await list.locator('button.try-out__btn').click();
  await list.locator('button.execute').click();
  await list.locator('.live-responses-table .response-col_status', { hasText: '200' }).waitFor();
  assert.equal(listed.length, 1, 'one GET /v1/jobs from /docs');
  assert.equal(listed[0].headers().authorization, `Bearer ${TOKEN}`);
  await shot(signedIn, 'preauthorized');
  await context.close();

  assert.deepEqual(problems, []);
  assert.deepEqual(elsewhere, [], 'requests to another origin');
  step('all good');
} finally {
  await browser.close();
}
