// Drives the viewer page in Debian's headless Chromium (a fresh profile each run), step by step, on commands from the
// test that runs it (tests/python/test_viewer.py):
//   stdin  "EXPECT <text>"  -> waits until a message with that text is on the page,
//   stdout "SAW <json>"       with the seqs shown so far and how often the stream reconnected;
//   stdin  "SHOT <path>"    -> saves a screenshot; stdout "SHOT <path>";
//   stdin  "CLICK <id>"     -> clicks a button by element id; stdout "CLICKED <id>";
//   stdin  "STATUS <text>"  -> waits until the status field shows the text; stdout "STATUS <text>";
//   stdin  "FOLLOW <id>"    -> clicks the event that opened sub-conversation <id>, waits for it to be
//                              the open conversation; stdout "FOLLOWED <json>" with its id and texts.
// Environment: VIEWER_URL, VIEWER_TOKEN, VIEWER_CONVERSATION, CHROMIUM (default /usr/bin/chromium).
import readline from "node:readline";
import { chromium } from "playwright-core";

const url = process.env.VIEWER_URL;
const token = process.env.VIEWER_TOKEN;
const conversation = process.env.VIEWER_CONVERSATION;
const timeout = 15000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const fail = async (message) => {
  console.log("FAIL " + message);
  await browser.close().catch(() => {});
  process.exit(1);
};

try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 760 } });
  page.on("pageerror", (e) => console.error("page error: " + e.message));
  await page.goto(url, { timeout });
  await page.fill("#token", token);
  await page.click("#signin-button");
  const item = page.locator(`#list .item[data-conversation="${conversation}"]`);
  await item.waitFor({ timeout });
  await item.click();
  await page.waitForFunction(() => window.viewerState.seqs.length > 0, null, { timeout });
  console.log("OPENED " + JSON.stringify(await page.evaluate(() => window.viewerState.seqs)));

  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, ...rest] = line.split(" ");
    const arg = rest.join(" ");
    if (cmd === "EXPECT") {
      await page
        .locator("#events .msg .text", { hasText: arg })
        .first()
        .waitFor({ timeout })
        .catch(() => fail(`no message "${arg}" appeared`));
      const seen = await page.evaluate(() => ({
        seqs: window.viewerState.seqs,
        reconnects: window.viewerState.reconnects,
        domSeqs: [...document.querySelectorAll("#events [data-seq]")].map((e) => Number(e.dataset.seq)),
      }));
      console.log("SAW " + JSON.stringify(seen));
    } else if (cmd === "SHOT") {
      await page.screenshot({ path: arg, fullPage: true });
      console.log("SHOT " + arg);
    } else if (cmd === "CLICK") {
      await page.click("#" + arg, { timeout });
      console.log("CLICKED " + arg);
    } else if (cmd === "STATUS") {
      await page
        .waitForFunction((t) => document.getElementById("c-status").textContent === t, arg, { timeout })
        .catch(() => fail(`status never became ${arg}`));
      console.log("STATUS " + arg);
    } else if (cmd === "FOLLOW") {
      await page
        .locator("#events .system.link", { hasText: `opened sub-conversation ${arg}` })
        .first()
        .click({ timeout })
        .catch(() => fail(`no link to sub-conversation ${arg}`));
      await page
        .waitForFunction((id) => document.getElementById("c-id").textContent === id &&
                                 window.viewerState.seqs.length >= 2, arg, { timeout })
        .catch(() => fail(`sub-conversation ${arg} did not open`));
      const shown = await page.evaluate(() => ({
        id: document.getElementById("c-id").textContent,
        texts: [...document.querySelectorAll("#events .msg .text")].map((e) => e.textContent),
        system: [...document.querySelectorAll("#events .system")].map((e) => e.textContent),
      }));
      console.log("FOLLOWED " + JSON.stringify(shown));
    } else if (cmd === "QUIT") {
      break;
    }
  }
  await browser.close();
} catch (e) {
  await fail(e.message.split("\n")[0]);
}
