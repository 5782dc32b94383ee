// What every browser script here shares: the environment
// crates/server/tests/suite/ui.rs sets (BASE_URL, TOKEN, CHROMIUM,
// PLAYWRIGHT_CORE), Playwright's chromium, step logging, and screenshots
// when SCREENSHOTS=DIR asks for them (to look at the UI by eye).

import path from 'node:path';
import { pathToFileURL } from 'node:url';

const { BASE_URL, TOKEN, CHROMIUM, PLAYWRIGHT_CORE } = process.env;
for (const [k, v] of Object.entries({ BASE_URL, TOKEN, CHROMIUM, PLAYWRIGHT_CORE })) {
  if (!v) throw new Error(`${k} is not set`);
}
export { BASE_URL, TOKEN, CHROMIUM };
export const { chromium } = await import(pathToFileURL(path.join(PLAYWRIGHT_CORE, 'index.mjs')).href);

export const step = (what) => console.log(`- ${what}`);

// `shot(page, name, opts)` saves DIR/PREFIXN-NAME.png, N counting up; a
// no-op without SCREENSHOTS. `defaults` are Playwright screenshot options.
export function shooter(prefix, defaults = {}) {
  if (!process.env.SCREENSHOTS) return async () => {};
  let n = 0;
  return (page, name, opts = {}) =>
    page.screenshot({
      path: path.join(process.env.SCREENSHOTS, `${prefix}${++n}-${name}.png`),
      ...defaults,
      ...opts,
    });
}
