// Drives the console page in Debian's headless Chromium (a fresh profile each run), step by step, on commands from the
// test that runs it (tests/python/test_console.py):
//   stdin  "EXPECT <text>"  -> waits until a message with that text is on the page,
//   stdout "SAW <json>"       with the seqs shown so far and how often the stream reconnected;
//   stdin  "SHOT <path>"    -> saves a screenshot; stdout "SHOT <path>";
//   stdin  "CLICK <id>"     -> clicks a button by element id; stdout "CLICKED <id>";
//   stdin  "STATUS <text>"  -> waits until the status field shows the text; stdout "STATUS <text>";
//   stdin  "FOLLOW <id>"    -> clicks the event that opened sub-conversation <id>, waits for it to be
//                              the open conversation; stdout "FOLLOWED <json>" with its id and texts.
//   stdin  "GUIDANCE <text>" -> waits until the guidance field contains the text; stdout "GUIDANCE <text>";
//   stdin  "SEND <text>"    -> types the text in the composer and sends it (Ctrl+Enter), waits for it to
//                              appear; stdout "SENT <json>" with how many messages show that text;
//   stdin  "VISIBLE <text>" -> stdout "VISIBLE <json>": whether the newest message with that text is
//                              inside the events pane's viewport;
//   stdin  "SCROLLUP"       -> scrolls the events pane to its top; stdout "SCROLLED top";
//   stdin  "MARKER"         -> waits for the "new events" marker; stdout "MARKER <its text>";
//   stdin  "NARROW <path>"  -> a 400 px wide viewport, a screenshot; stdout "NARROW <json>" with the
//                              page's width and its scroll width (no sideways scrolling);
//   stdin  "FAILURES"       -> stdout "FAILURES <json>": requests that failed or answered >= 400;
//   stdin  "TIMELINE"       -> opens the timeline; stdout "TIMELINE <json>" with each turn row's text;
//   stdin  "TREE"           -> opens the tree; stdout "TREE <json>" with the conversations it shows;
//   stdin  "CREATE <name>"  -> an admin creates a conversation from library scenario <name>; stdout
//                              "CREATED <id>" once it is open;
//   stdin  "SEARCH <text>"  -> types in the search box, waits for the server's page for it; stdout
//                              "LISTED <json>" with the ids shown;
//   stdin  "SCROLL"         -> scrolls the list to its end, waits for the next page; stdout
//                              "LISTED <json>" with the ids shown;
//   stdin  "STREAMING"      -> stdout "STREAMING <n>": bubbles still marked as streaming;
//   stdin  "APPROVAL"       -> waits for the approval bar; stdout "APPROVAL <its text>";
//   stdin  "SIGNOUT"        -> signs out; stdout "SIGNEDOUT <json>" with the token field's value and
//                              whether the sign-in card shows;
//   stdin  "SIGNIN <token>" -> types the token (as a person pastes it) and signs in; stdout
//                              "SIGNEDIN <json>" with who is signed in, or the error shown;
//   stdin  "TOKENS"         -> opens the tokens panel; stdout "TOKENS <json>" with each row's agent;
//   stdin  "MINT <agent>"   -> mints a token for the agent there; stdout "MINTED <the token shown>";
//   stdin  "REVOKE <agent>" -> revokes that agent's token there; stdout "REVOKED <json>" with the
//                              agents left.
// Without VIEWER_CONVERSATION it opens none and says "SIGNEDIN <json>" (whether the app was hidden
// before signing in, and the controls still disabled).
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
  const failures = [];
  page.on("requestfailed", (r) => {
    // A stream the page itself aborts (switching conversations) is not a failure.
    if (!(r.failure() || {}).errorText?.includes("ERR_ABORTED")) failures.push(`${r.url()} ${(r.failure() || {}).errorText}`);
  });
  page.on("response", (r) => { if (r.status() >= 400) failures.push(`${r.url()} ${r.status()}`); });
  // The console runs under a strict Content-Security-Policy: anything it blocks is a failure.
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy/i.test(m.text())) failures.push("CSP: " + m.text());
  });
  await page.goto(url, { timeout });
  // Before signing in, the sign-in card is all there is.
  const appHidden = await page.evaluate(() => document.getElementById("app").hidden);
  await page.fill("#token", token);
  await page.click("#signin-button");
  if (conversation) {
    const item = page.locator(`#list .item[data-conversation="${conversation}"]`);
    await item.waitFor({ timeout });
    await item.click();
    await page.waitForFunction(() => window.viewerState.seqs.length > 0, null, { timeout });
    console.log("OPENED " + JSON.stringify(await page.evaluate(() => window.viewerState.seqs)));
  } else {
    await page.locator("#list").waitFor({ timeout });
    const disabled = await page.evaluate(() =>
      ["say", "send", "timeline-button", "tree-button", "pause", "resume"].filter((id) => document.getElementById(id).disabled));
    console.log("SIGNEDIN " + JSON.stringify({ appHidden, disabled }));
  }

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
    } else if (cmd === "GUIDANCE") {
      await page
        .waitForFunction((t) => document.getElementById("c-guidance").textContent.includes(t), arg, { timeout })
        .catch(() => fail(`guidance never said ${arg}`));
      console.log("GUIDANCE " + arg);
    } else if (cmd === "SEND") {
      await page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout })
        .catch(() => fail("the composer stayed disabled"));
      await page.fill("#say", arg);
      await page.press("#say", "Control+Enter");
      const texts = page.locator("#events .msg .text", { hasText: arg });
      await texts.first().waitFor({ timeout }).catch(() => fail(`the sent message "${arg}" did not appear`));
      // Whatever else comes in the next moment, the message shows once.
      await page.waitForTimeout(300);
      console.log("SENT " + JSON.stringify({ count: await texts.count(), cleared: await page.inputValue("#say") === "" }));
    } else if (cmd === "VISIBLE") {
      const msg = page.locator("#events .msg", { hasText: arg }).last();
      await msg.waitFor({ timeout }).catch(() => fail(`no message "${arg}"`));
      await page.waitForTimeout(100);
      const inside = await page.evaluate((t) => {
        const box = document.getElementById("events").getBoundingClientRect();
        const all = [...document.querySelectorAll("#events .msg")].filter((m) => m.textContent.includes(t));
        const r = all[all.length - 1].getBoundingClientRect();
        return r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
      }, arg);
      console.log("VISIBLE " + JSON.stringify(inside));
    } else if (cmd === "SCROLLUP") {
      await page.evaluate(() => { document.getElementById("events").scrollTop = 0; });
      console.log("SCROLLED top");
    } else if (cmd === "MARKER") {
      await page.locator("#newer").waitFor({ state: "visible", timeout }).catch(() => fail("no new-events marker"));
      console.log("MARKER " + (await page.textContent("#newer")));
    } else if (cmd === "NARROW") {
      await page.setViewportSize({ width: 400, height: 800 });
      await page.waitForTimeout(100);
      await page.screenshot({ path: arg, fullPage: true });
      const widths = await page.evaluate(() => ({
        width: document.documentElement.clientWidth,
        scrollWidth: document.documentElement.scrollWidth,
      }));
      console.log("NARROW " + JSON.stringify(widths));
    } else if (cmd === "TIMELINE") {
      await page.click("#timeline-button", { timeout });
      await page.locator("#panel .turnrow").first().waitFor({ timeout }).catch(() => fail("no timeline rows"));
      const rows = await page.$$eval("#panel .turnrow", (rs) => rs.map((r) => r.textContent));
      console.log("TIMELINE " + JSON.stringify(rows));
    } else if (cmd === "TREE") {
      await page.click("#tree-button", { timeout });
      await page.locator("#panel .tree .node").first().waitFor({ timeout }).catch(() => fail("no tree"));
      await page.waitForTimeout(300);
      const ids = await page.$$eval("#panel .tree .node", (ns) => ns.map((n) => n.dataset.conversation));
      console.log("TREE " + JSON.stringify(ids));
    } else if (cmd === "CREATE") {
      await page.locator(`#scenario option[value="${arg}"]`).waitFor({ state: "attached", timeout })
        .catch(() => fail(`no scenario ${arg} in the library`));
      await page.selectOption("#scenario", arg);
      await page.click("#create-button");
      await page.waitForFunction(() => window.viewerState.open && window.viewerState.seqs.length > 0, null, { timeout })
        .catch(() => fail("the created conversation did not open"));
      console.log("CREATED " + (await page.evaluate(() => window.viewerState.open)));
    } else if (cmd === "SEARCH") {
      await page.fill("#search", arg);
      // The server filters: wait for the list read for this text.
      await page.waitForFunction((text) => window.viewerState.listedQuery === text, arg);
      const ids = await page.$$eval("#list .item", (items) => items.map((i) => i.dataset.conversation));
      console.log("LISTED " + JSON.stringify(ids));
    } else if (cmd === "SCROLL") {
      // To the list's end, until the next page is in.
      const pages = await page.evaluate(() => window.viewerState.pages);
      await page.$eval("#list", (l) => l.scrollTo(0, l.scrollHeight));
      await page.waitForFunction((n) => window.viewerState.pages > n, pages);
      const ids = await page.$$eval("#list .item", (items) => items.map((i) => i.dataset.conversation));
      console.log("LISTED " + JSON.stringify(ids));
    } else if (cmd === "STREAMING") {
      await page.waitForTimeout(300);
      console.log("STREAMING " + (await page.locator("#events .msg.streaming").count()));
    } else if (cmd === "MODE") {
      await page.selectOption("#mode", arg);
      console.log("MODE " + arg);
    } else if (cmd === "DOCS") {
      await page
        .waitForFunction((n) => document.querySelectorAll("#events .msg.doc").length >= n, Number(arg), { timeout })
        .catch(() => fail(`fewer than ${arg} documents shown`));
      const docs = await page.$$eval("#events .msg.doc", (ds) => ds.map((d) => ({
        head: d.querySelector(".doc-head").textContent,
        headings: [...d.querySelectorAll(".doc-body h1, .doc-body h2, .doc-body h3")].map((h) => h.textContent),
        items: [...d.querySelectorAll(".doc-body li")].map((li) => li.textContent),
        strong: [...d.querySelectorAll(".doc-body strong")].map((b) => b.textContent),
        folds: [...d.querySelectorAll(".doc-body details")].map((x) => ({ label: x.querySelector("summary").textContent, open: x.open })),
        leaves: [...d.querySelectorAll(".doc-body .leaf")].map((l) => l.textContent),
        rawHtml: d.querySelector(".doc-body").innerHTML.includes("<script"),
      })));
      const system = await page.$$eval("#events .system", (ss) => ss.map((x) => x.textContent));
      console.log("DOCS " + JSON.stringify({ docs, system }));
    } else if (cmd === "APPROVAL") {
      await page.locator("#approval:not([hidden])").waitFor({ timeout }).catch(() => fail("no approval bar"));
      console.log("APPROVAL " + (await page.textContent("#approval-what")));
    } else if (cmd === "TOKENS") {
      await page.click("#tokens-button", { timeout });
      await page.locator("#token-rows .tokenrow").first().waitFor({ timeout }).catch(() => fail("no tokens listed"));
      const agents = await page.$$eval("#token-rows .tokenrow", (rs) => rs.map((r) => r.dataset.agent));
      console.log("TOKENS " + JSON.stringify(agents));
    } else if (cmd === "MINT") {
      await page.fill("#token-agent", arg);
      await page.click("#token-form button[type=submit]");
      await page.locator("#token-once").waitFor({ state: "visible", timeout }).catch(() => fail("no token shown"));
      await page.locator(`#token-rows .tokenrow[data-agent="${arg}"]`).waitFor({ timeout })
        .catch(() => fail(`${arg} not listed`));
      console.log("MINTED " + (await page.textContent("#token-shown")));
    } else if (cmd === "REVOKE") {
      await page.click(`#token-rows .tokenrow[data-agent="${arg}"] button`, { timeout });
      await page.locator(`#token-rows .tokenrow[data-agent="${arg}"]`).waitFor({ state: "detached", timeout })
        .catch(() => fail(`${arg} still listed`));
      const agents = await page.$$eval("#token-rows .tokenrow", (rs) => rs.map((r) => r.dataset.agent));
      console.log("REVOKED " + JSON.stringify(agents));
    } else if (cmd === "SIGNOUT") {
      await page.click("#signout", { timeout });
      await page.locator("#signin:not([hidden])").waitFor({ timeout }).catch(() => fail("no sign-in card"));
      const field = await page.inputValue("#token");
      const listed = await page.locator("#list .item").count();
      console.log("SIGNEDOUT " + JSON.stringify({ field, listed }));
    } else if (cmd === "SIGNIN") {
      await page.locator("#token").pressSequentially(arg, { timeout });
      await page.click("#signin-button");
      await page.waitForFunction(() => document.getElementById("whoami").textContent ||
                                       document.getElementById("error").textContent, null, { timeout })
        .catch(() => fail("signing in showed nothing"));
      const who = await page.textContent("#whoami");
      const error = await page.textContent("#error");
      console.log("SIGNEDIN " + JSON.stringify({ who, error }));
    } else if (cmd === "FAILURES") {
      console.log("FAILURES " + JSON.stringify(failures));
    } else if (cmd === "QUIT") {
      break;
    }
  }
  await browser.close();
} catch (e) {
  await fail(e.message.split("\n")[0]);
}
