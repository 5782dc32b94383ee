// A preview in headless Chromium: a page the sandbox serves, opened by its
// signed link after the web UI was signed in, on an origin of its own. The
// page is hostile: it tries the API with the browser's credentials, reads
// its cookies and storage, and opens a WebSocket through the preview. It
// must get nothing of cordon's; the WebSocket must echo.
// The page is opened from the job's Ports panel in the web UI, and by its
// link in a browser that never signed in (whoever the link was shared with).
// Run by crates/server/tests/suite/ui.rs with BASE_URL, TOKEN, CHROMIUM,
// PLAYWRIGHT_CORE, JOB_ID (a running job serving on 8080) and PREVIEW_URL
// (a link to its page) set.

import assert from 'node:assert/strict';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

const { PREVIEW_URL, JOB_ID } = process.env;
if (!PREVIEW_URL || !JOB_ID) throw new Error('PREVIEW_URL and JOB_ID must be set');
const shot = shooter('preview-');
const origin = new URL(BASE_URL).origin;

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1000, height: 700 } });
  context.setDefaultTimeout(60000);
  // Every request: the token goes to the server's origin only, as a header.
  const leaks = [];
  context.on('request', (r) => {
    const auth = r.headers().authorization;
    if (r.url().includes(TOKEN)) leaks.push(`token in a URL: ${r.url()}`);
    if (auth && new URL(r.url()).origin !== origin) leaks.push(`token sent to ${r.url()}`);
  });

  step('sign in to the web UI, as a user would before opening a preview');
  const ui = await context.newPage();
  await ui.goto(`${BASE_URL}/`);
  await ui.fill('input[name=token]', TOKEN);
  await ui.click('form.sign-in button[type=submit]');
  await ui.locator('table.jobs').waitFor();

  step('the job\'s Ports panel lists 8080; Open shows the page in a new tab');
  await ui.goto(`${BASE_URL}/#/jobs/${JOB_ID}`);
  const open = ui.locator('.ports li[data-port="8080"] button.preview-open');
  await open.waitFor();
  await shot(ui, 'ports-panel');
  const [page] = await Promise.all([context.waitForEvent('page'), open.click()]);
  await page.locator('h1', { hasText: 'made in the sandbox' }).waitFor();
  const url = new URL(page.url());
  assert.notEqual(url.origin, origin, 'the preview runs on an origin of its own');
  assert.equal(url.searchParams.get('cordon_link'), null, 'the link is gone from the address');
  assert.equal(await page.evaluate(() => window.opener), null, 'the preview has no handle on the UI');
  await ui.locator('.ports li[data-port="8080"] a.preview-link').waitFor();
  await shot(ui, 'ports-opened');

  step('the page\'s attempts come back empty-handed');
  await page.locator('#result[data-done]').waitFor();
  const got = JSON.parse(await page.textContent('#result'));
  console.log(`  what the page got: ${JSON.stringify(got)}`);
  assert.equal(got.cookie, '', 'the page reads no cookie (its own is HttpOnly)');
  assert.ok(!JSON.stringify(got).includes(TOKEN), 'the page read the token');
  assert.notEqual(got.api, 200, 'the page read the API');
  assert.equal(got.ws, 'echo: from the page', 'a WebSocket through the preview');
  await shot(page, 'page');

  step('the shared link, in a browser that never signed in');
  const stranger = await browser.newContext();
  const theirs = await stranger.newPage();
  await theirs.goto(PREVIEW_URL);
  await theirs.locator('#result[data-done]').waitFor();
  assert.equal(new URL(theirs.url()).searchParams.get('cordon_link'), null);
  await stranger.close();
  assert.deepEqual(leaks, []);
} finally {
  await browser.close();
}
