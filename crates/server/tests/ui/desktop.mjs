// The live desktop of a gui job in headless Chromium: the page shows the
// sandbox's screen through noVNC, view-only until the user takes control,
// and the user's keys reach a program on that screen only then.
// Run by crates/server/tests/suite/ui.rs with BASE_URL, TOKEN, CHROMIUM and
// PLAYWRIGHT_CORE set.

import assert from 'node:assert/strict';

import { BASE_URL, TOKEN, CHROMIUM, chromium, step, shooter } from './harness.mjs';

const shot = shooter('desktop-');

// The file the job's xterm writes, through the API: null while absent.
async function typed(jobId) {
  const r = await fetch(`${BASE_URL}/v1/jobs/${jobId}/files/typed.txt`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  if (r.status === 404) return null;
  assert.equal(r.status, 200);
  return r.text();
}

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1366, height: 900 } });
  page.setDefaultTimeout(30000);
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(`console: ${m.text()}`);
  });

  step('sign in and submit a gui job from the form');
  await page.goto(`${BASE_URL}/`);
  await page.fill('input[name=token]', TOKEN);
  await page.click('form.sign-in button[type=submit]');
  await page.locator('table.jobs').waitFor();
  await page.click('a[data-nav=new]');
  await page.selectOption('select[name=kind]', 'gui');
  await page.fill('input[name=display]', '800x600');
  // A blue desktop, and an xterm at the top left whose shell writes the
  // first line it reads; the job ends once that file exists.
  await page.fill('textarea[name=steps]', JSON.stringify([
    { tool: 'shell', command: "xsetroot -solid '#3366cc'; xterm -geometry 40x8+0+0 -title typer -e sh -c 'read line; echo \"$line\" > /workspace/typed.txt' >/dev/null 2>&1 & xdotool search --sync --name typer >/dev/null" },
    { tool: 'shell', command: 'while [ ! -s /workspace/typed.txt ]; do sleep 0.1; done; cat /workspace/typed.txt' },
    { tool: 'computer', action: 'screenshot' },
  ]));
  await page.fill('input[name=timeout_secs]', '120');
  await page.click('form.job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/job_/);
  const jobId = decodeURIComponent(page.url().split('/').pop());

  step('the desktop appears, view-only, and the canvas draws the sandbox\'s screen');
  await page.locator('.desktop .screen[data-state=connected] canvas').waitFor();
  assert.match(await page.textContent('.desktop .status'), /view only/);
  // The desktop's blue, read back from the canvas noVNC draws into, far
  // from the xterm.
  await page.waitForFunction(() => {
    const c = document.querySelector('.desktop .screen canvas');
    if (!c || c.width < 100) return false;
    const [r, g, b] = c.getContext('2d').getImageData(c.width - 10, c.height - 10, 1, 1).data;
    return r === 0x33 && g === 0x66 && b === 0xcc;
  });
  // And the xterm: white, at the top left.
  await page.waitForFunction(() => {
    const c = document.querySelector('.desktop .screen canvas');
    const [r, g, b] = c.getContext('2d').getImageData(100, 70, 1, 1).data;
    return r === 255 && g === 255 && b === 255;
  });
  const size = await page.evaluate(() => {
    const c = document.querySelector('.desktop .screen canvas');
    return [c.width, c.height];
  });
  assert.deepEqual(size, [800, 600], 'the canvas holds the whole 800x600 screen');
  await shot(page, 'view-only');

  // A point of the xterm, in page coordinates: noVNC scales the screen
  // into the box, so map framebuffer pixels through the canvas's box.
  const onXterm = async () => {
    const box = await page.locator('.desktop .screen canvas').boundingBox();
    return [box.x + (120 * box.width) / 800, box.y + (70 * box.height) / 600];
  };

  step('view-only: a click and keys reach nothing');
  await page.mouse.click(...(await onXterm()));
  await page.keyboard.type('not-from-a-viewer');
  await page.keyboard.press('Enter');
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(await typed(jobId), null, 'a view-only page typed into the desktop');

  step('take control: the same click and keys reach the xterm');
  await page.check('.desktop input[name=control]');
  await page.locator('.desktop .status', { hasText: 'you have control' }).waitFor();
  await page.mouse.click(...(await onXterm()));
  await page.keyboard.type('from-the-browser');
  await page.keyboard.press('Enter');
  await page.locator('.toolbar .badge.state-succeeded').waitFor();
  assert.equal(await typed(jobId), 'from-the-browser\n');
  assert.match(await page.textContent('pre.output'), /from-the-browser/);

  step('the job ended, and the page says so, keeping the last picture');
  await page.locator('.desktop .status', { hasText: 'the job has ended' }).waitFor();
  await page.locator('.desktop .screen img.last').waitFor();
  assert.equal(await page.isDisabled('.desktop input[name=control]'), true);

  step('its screenshots show as a strip');
  await page.waitForFunction(() => {
    const img = document.querySelector('.shots img');
    return img && img.complete && img.naturalWidth === 800 && img.naturalHeight === 600;
  });
  // One numbering: the caption's, the file's and the output's marker.
  assert.match(await page.getAttribute('.shots img', 'alt'), /step 3: screenshots\/step-03\.png/);
  assert.match(await page.textContent('.shots figcaption'), /^step 3$/);
  assert.match(await page.textContent('pre.output'), /▸ step 3: computer/);
  await shot(page, 'ended');

  assert.deepEqual(problems, []);
  step('all good');
} finally {
  await browser.close();
}
