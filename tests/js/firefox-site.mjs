// Drives a served site in Firefox (Debian's firefox-esr) through puppeteer-core over WebDriver BiDi: loads the
// page, clicks every sample button in turn and writes, as JSON, the page's state after the load and after each
// sample (window.webbuild: text, tokens, margins, info, error) with the console messages, uncaught errors and
// the requests that failed or were answered with an HTTP error.
// tests/e2e/test_firefox.py compares the tokens with the Python reference.
//
//   node tests/js/firefox-site.mjs URL OUT.json [FIREFOX] [TIMEOUT_S]
import { writeFileSync } from 'node:fs';
import puppeteer from 'puppeteer-core';

const [url, out, firefox = '/usr/bin/firefox-esr', timeoutS = '300'] = process.argv.slice(2);
const deadline = Date.now() + Number(timeoutS) * 1000;
const result = { firefox: null, ready: null, samples: [], console: [], errors: [], failedRequests: [], failure: null };

async function until(page, predicate, what) {
  try {
    await page.waitForFunction(predicate, { polling: 100, timeout: Math.max(1, deadline - Date.now()) });
  } catch (e) {
    // what the page and its workers said and whether it was isolated: where a stalled load stopped
    const where = await page.evaluate(() => ({ isolated: globalThis.crossOriginIsolated,
      serviceWorker: navigator.serviceWorker?.controller?.scriptURL ?? null })).catch((err) => String(err));
    throw new Error(`${what}: not done in ${timeoutS} s (${e.message}); page state ${JSON.stringify(await state(page))}; `
      + `page ${JSON.stringify(where)}; console ${JSON.stringify(result.console.slice(-20))}; errors ${JSON.stringify(result.errors)}`);
  }
}

const state = (page) => page.evaluate(() => window.webbuild ?? null);

async function run(page) {
  page.on('console', (m) => result.console.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => result.errors.push(String(e?.message ?? e)));
  page.on('requestfailed', (r) => result.failedRequests.push(`${r.url()}: ${r.failure()?.errorText}`));
  page.on('response', (r) => { if (r.status() >= 400) result.failedRequests.push(`${r.url()}: HTTP ${r.status()}`); });
  await page.goto(url);
  await until(page, () => ['ready', 'error'].includes(window.webbuild?.status), 'model load');
  result.ready = await state(page);
  if (result.ready.status !== 'ready') return;
  const ids = await page.evaluate(() => [...document.querySelectorAll('button.sample')].map((b) => b.id));
  for (const id of ids) {
    await page.click(`#${id}`); // the page's click handler sets status 'transcribing' before it awaits
    await until(page, () => window.webbuild.status === 'done' || window.webbuild.error, `sample ${id}`);
    result.samples.push({ id, state: await state(page) });
  }
}

const browser = await puppeteer.launch({ browser: 'firefox', executablePath: firefox, protocol: 'webDriverBiDi',
  headless: true });
try {
  result.firefox = await browser.version();
  await run(await browser.newPage());
} catch (e) {
  result.failure = String(e?.stack ?? e);
} finally {
  await browser.close();
  writeFileSync(out, JSON.stringify(result));
}
process.exitCode = result.failure ? 1 : 0;
