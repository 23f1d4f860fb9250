"use strict";
// The tenant's tokens, for its admins: the list (never a token itself), minting one (shown this
// once) and revoking one.

function tokenDate(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 16) + "Z" : "never";
}

async function loadTokens() {
  try {
    const { tokens } = await api("GET", "/tokens");
    const rows = tokens.map((t) => {
      const row = el("tr", "tokenrow");
      row.dataset.agent = t.agentId;
      for (const text of [t.id, t.agentId, t.admin ? "admin" : "", tokenDate(t.createdMs),
                          tokenDate(t.lastUsedMs), tokenDate(t.expiresMs)]) {
        row.append(el("td", "", text));
      }
      const revoke = el("button", "", "Revoke");
      revoke.type = "button";
      revoke.addEventListener("click", () => revokeToken(t.id));
      const cell = el("td", "");
      cell.append(revoke);
      row.append(cell);
      return row;
    });
    $("token-rows").replaceChildren(...rows);
  } catch (e) {
    showError(e.message);
  }
}

async function mintToken() {
  const agentId = $("token-agent").value.trim();
  if (!agentId) return;
  const body = { agentId, admin: $("token-admin").checked };
  const days = Number($("token-expiry").value);
  if (days > 0) body.expiresIn = days + "d";
  try {
    const made = await api("POST", "/tokens", body);
    // Shown this once: the server keeps only its hash.
    $("token-shown").textContent = made.token;
    $("token-once").hidden = false;
    $("token-agent").value = "";
    showError("");
    await loadTokens();
  } catch (e) {
    showError(e.message);
  }
}

async function revokeToken(id) {
  try {
    await api("DELETE", `/tokens/${encodeURIComponent(id)}`);
    await loadTokens();
  } catch (e) {
    showError(e.message);
  }
}

function toggleTokens() {
  const open = $("tokens").hidden;
  $("tokens").hidden = !open;
  $("tokens-button").setAttribute("aria-pressed", String(open));
  $("token-once").hidden = true;
  if (open) loadTokens();
}

$("tokens-button").addEventListener("click", toggleTokens);
$("token-form").addEventListener("submit", (e) => { e.preventDefault(); mintToken(); });
