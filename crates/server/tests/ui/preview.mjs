// A preview in headless Chromium: a page the sandbox serves, opened by its
// signed link after the web UI was signed in, on an origin of its own. The
// page is hostile: it tries the API with the browser's credentials, reads
// its cookies and storage, and opens a WebSocket through the preview. It
// must get nothing of cordon's; the WebSocket must echo.
// Run by crates/server/tests/ui.rs with BASE_URL, TOKEN, CHROMIUM,
// PLAYWRIGHT_CORE and PREVIEW_URL (the link to the page) set.

import assert from 'node:assert/strict';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

const { PREVIEW_URL } = process.env;
if (!PREVIEW_URL) throw new Error('PREVIEW_URL is not set');
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

  step('open the link: the page, on an origin of its own, the link spent');
  const page = await context.newPage();
  await page.goto(PREVIEW_URL);
  await page.locator('h1', { hasText: 'made in the sandbox' }).waitFor();
  const url = new URL(page.url());
  assert.notEqual(url.origin, origin, 'the preview runs on an origin of its own');
  assert.equal(url.searchParams.get('cordon_link'), null, 'the link is gone from the address');

  step('the page\'s attempts come back empty-handed');
  await page.locator('#result[data-done]').waitFor();
  const got = JSON.parse(await page.textContent('#result'));
  console.log(`  what the page got: ${JSON.stringify(got)}`);
  assert.equal(got.cookie, '', 'the page reads no cookie (its own is HttpOnly)');
  assert.ok(!JSON.stringify(got).includes(TOKEN), 'the page read the token');
  assert.notEqual(got.api, 200, 'the page read the API');
  assert.equal(got.ws, 'echo: from the page', 'a WebSocket through the preview');
  await shot(page, 'page');
  assert.deepEqual(leaks, []);
} finally {
  await browser.close();
}
