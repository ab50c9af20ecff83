// The svc owner dashboard. Plain browser JavaScript, no build step.
//
// Everything shown comes from the owner routes (docs/specifications/owner-routes.md)
// with the admin session cookie. State-changing requests carry the CSRF token from
// GET /me in X-CSRF-Token. Text from the server is only ever placed with textContent.
// URLs are relative to the page (served at /dashboard), so "me" is /me here and
// /api/me when the page is served under /api.
"use strict";

(function () {
  const JOURNAL_PAGE = 50;
  const JOURNAL_KEEP = 500;
  const STREAM_RETRY_MS = 5000;
  const USAGE_REFRESH_MS = 2000;

  const state = {
    csrf: null,
    allocations: [],
    tenant: null,
    stream: null,
    lastSeq: 0,
    seen: new Set(),
    usageTimer: null,
  };

  // ---- small helpers ---------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  // Builds an element; attrs become attributes (data-*, class, type...), children are
  // nodes or strings (strings become text nodes, never markup).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  function humanBytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "?";
    let value = n;
    let unit = 0;
    while (value >= 1024 && unit < UNITS.length - 1) {
      value /= 1024;
      unit += 1;
    }
    if (unit === 0) return `${n} B`;
    return `${value.toFixed(value < 10 ? 2 : value < 100 ? 1 : 0)} ${UNITS[unit]}`;
  }

  function percent(fraction) {
    if (fraction > 0 && fraction < 0.001) return "<0.1%";
    return `${(fraction * 100).toFixed(1)}%`;
  }

  function when(iso) {
    if (!iso) return "—";
    const date = new Date(iso);
    if (isNaN(date.getTime())) return String(iso);
    return date.toLocaleString();
  }

  function timeNode(iso) {
    return el("time", { datetime: iso || null, title: iso || null }, when(iso));
  }

  // ---- HTTP -------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body, requestId) {
      const code = (body && body.error) || `HTTP ${status}`;
      const detail = body && body.error_description ? ` (${body.error_description})` : "";
      super(`${code}${detail}`);
      this.status = status;
      this.body = body;
      this.requestId = requestId;
    }
  }

  class SignedOut extends Error {}

  // One request to the control plane. Answers the decoded JSON body (null for 204);
  // throws SignedOut on 401 (after switching the page to signed out) and ApiError
  // on any other failure.
  async function api(method, url, body) {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method !== "GET") {
      init.headers["Content-Type"] = "application/json";
      init.headers["X-CSRF-Token"] = state.csrf || "";
      if (body !== undefined) init.body = JSON.stringify(body);
    }
    const response = await fetch(url, init);
    const text = await response.text();
    let decoded = null;
    if (text) {
      try {
        decoded = JSON.parse(text);
      } catch (e) {
        decoded = null;
      }
    }
    if (response.status === 401) {
      signedOut();
      throw new SignedOut();
    }
    if (!response.ok) {
      throw new ApiError(response.status, decoded, response.headers.get("X-Request-ID"));
    }
    return decoded;
  }

  function showError(context, error) {
    if (error instanceof SignedOut) return;
    let text = `${context}: ${error.message}`;
    if (error.requestId) text += ` [request ${error.requestId}]`;
    $("error-text").textContent = text;
    show($("error"), true);
  }

  // Runs an async action, reporting failures in the error banner.
  function guarded(context, action) {
    return async (...args) => {
      try {
        await action(...args);
      } catch (error) {
        showError(context, error);
      }
    };
  }

  // ---- signed in / out ----------------------------------------------------------

  function signedOut() {
    closeStream();
    window.clearTimeout(state.usageTimer);
    state.csrf = null;
    document.body.dataset.state = "signed-out";
    show($("loading"), false);
    show($("who"), false);
    show($("signed-in"), false);
    show($("signed-out"), true);
  }

  async function start() {
    let me;
    try {
      me = await api("GET", "me");
    } catch (error) {
      show($("loading"), false);
      showError("loading your account", error);
      return;
    }
    state.csrf = me.csrf_token || null;
    $("me-name").textContent = me.display_name || me.user_id;
    $("me-user").textContent = me.user_id;
    $("me-expires").textContent = me.session_expires_at
      ? `session until ${when(me.session_expires_at)}`
      : "";
    show($("loading"), false);
    show($("who"), true);
    show($("signed-in"), true);
    document.body.dataset.state = "signed-in";
    await Promise.all([
      guarded("loading allocations", loadAllocations)(),
      guarded("loading API tokens", loadTokens)(),
    ]);
    chooseTenants();
  }

  async function logout() {
    try {
      await api("POST", "auth/logout");
    } catch (error) {
      if (!(error instanceof SignedOut)) {
        showError("logging out", error);
        return;
      }
    }
    signedOut();
  }

  // ---- allocations ----------------------------------------------------------------

  async function loadAllocations() {
    const body = await api("GET", "allocations");
    state.allocations = body.allocations || [];
    const list = $("allocations");
    list.replaceChildren(...state.allocations.map(allocationCard));
    show($("allocations-empty"), state.allocations.length === 0);
    for (const allocation of state.allocations) {
      loadUsage(allocation);
    }
  }

  function allocationCard(a) {
    const title = a.agent_id ? `agent ${a.agent_id}` : "owner allocation";
    const bar = el("div", { class: "bar-fill", "data-testid": "usage-bar" });
    const usage = el(
      "div",
      { class: "usage" },
      el("div", { class: "bar", role: "presentation" }, bar),
      el("span", { class: "usage-text", "data-testid": "usage-text" }, "usage: loading…"),
    );
    const item = el(
      "li",
      {
        class: "allocation",
        "data-testid": "allocation",
        "data-allocation-id": a.allocation_id,
        "data-state": a.state,
      },
      el(
        "div",
        { class: "allocation-head" },
        el("strong", {}, title),
        el("span", { class: `badge state-${a.state}`, "data-testid": "allocation-state" }, a.state),
      ),
      el(
        "div",
        { class: "muted small" },
        `tenant ${a.tenant_id} · allocation ${a.allocation_id}`,
        a.virtual_path ? ` · ${a.virtual_path}` : "",
        ` · created ${when(a.created_at)}`,
        a.revoked_at ? ` · revoked ${when(a.revoked_at)}` : "",
      ),
      usage,
      mountStatus(a),
    );
    return item;
  }

  function mountStatus(a) {
    const box = el("div", { class: "mount", "data-testid": "mount-status" });
    const m = a.mount;
    if (!m) {
      box.dataset.mount = "none";
      box.append(el("span", {}, "Not mounted."));
      return box;
    }
    box.dataset.mount = m.live ? "live" : "expired";
    box.append(
      el("span", { class: m.live ? "badge live" : "badge expired" }, m.live ? "mounted" : "lease expired"),
      el(
        "span",
        {},
        "held by ",
        el("strong", {}, m.agent_id),
        " since ",
        timeNode(m.bound_at),
        m.live ? " · lease until " : " · lease ended ",
        timeNode(m.lease_expires_at),
      ),
    );
    if (a.state !== "revoked") {
      const button = el(
        "button",
        { type: "button", class: "danger", "data-testid": "force-unmount" },
        "Force unmount",
      );
      button.addEventListener(
        "click",
        guarded("force unmount", async () => {
          const question =
            `Force-unmount the disk of ${a.agent_id || a.allocation_id}? ` +
            "The holder's certificate is revoked and its connections are closed.";
          if (!window.confirm(question)) return;
          button.disabled = true;
          try {
            await api("POST", `allocations/${encodeURIComponent(a.allocation_id)}/unmount`);
          } finally {
            button.disabled = false;
          }
          await loadAllocations();
        }),
      );
      box.append(button);
    }
    return box;
  }

  async function loadUsage(a) {
    const card = document.querySelector(
      `[data-testid="allocation"][data-allocation-id="${CSS.escape(a.allocation_id)}"]`,
    );
    if (!card) return;
    const text = card.querySelector('[data-testid="usage-text"]');
    const fill = card.querySelector('[data-testid="usage-bar"]');
    try {
      const usage = await api("GET", `allocations/${encodeURIComponent(a.allocation_id)}/usage`);
      const used = usage.used_bytes;
      const grant = usage.grant_bytes;
      const fraction = grant > 0 ? Math.min(1, used / grant) : 0;
      // CSSOM, not a style attribute: allowed by the page's CSP.
      fill.style.width = `${(fraction * 100).toFixed(2)}%`;
      fill.classList.toggle("high", fraction >= 0.9);
      fill.classList.toggle("nonzero", used > 0); // a sliver, however small the share
      text.textContent = `${humanBytes(used)} of ${humanBytes(grant)} used (${percent(fraction)})`;
      card.dataset.usedBytes = String(used);
    } catch (error) {
      if (error instanceof SignedOut) return;
      text.textContent = `usage unavailable: ${error.message}`;
      text.classList.add("warn");
    }
  }

  // A write changes usage: reload the tenant's usage once the burst settles.
  function refreshUsageSoon(tenant) {
    window.clearTimeout(state.usageTimer);
    state.usageTimer = window.setTimeout(() => {
      for (const allocation of state.allocations) {
        if (allocation.tenant_id === tenant) loadUsage(allocation);
      }
    }, USAGE_REFRESH_MS);
  }

  // ---- API tokens -------------------------------------------------------------------

  async function loadTokens() {
    const body = await api("GET", "v1/tokens");
    const tokens = body.tokens || [];
    $("tokens").replaceChildren(...tokens.map(tokenRow));
    show($("tokens-empty"), tokens.length === 0);
    show($("tokens-table"), tokens.length > 0);
  }

  function tokenRow(t) {
    const status = t.revoked_at
      ? el("span", { class: "badge expired" }, "revoked ", timeNode(t.revoked_at))
      : el("span", { class: "badge live" }, "active");
    const actions = el("td", {});
    if (!t.revoked_at) {
      const button = el(
        "button",
        { type: "button", class: "danger", "data-testid": "token-revoke" },
        "Revoke",
      );
      button.addEventListener(
        "click",
        guarded("revoking the token", async () => {
          if (!window.confirm(`Revoke the API token "${t.name}"? It stops working at once.`)) {
            return;
          }
          await api("DELETE", `v1/tokens/${encodeURIComponent(t.id)}`);
          await loadTokens();
        }),
      );
      actions.append(button);
    }
    return el(
      "tr",
      {
        "data-testid": "token",
        "data-token-id": t.id,
        "data-token-name": t.name,
        "data-revoked": t.revoked_at ? "true" : "false",
      },
      el("td", {}, t.name),
      el("td", {}, timeNode(t.created_at)),
      el("td", {}, t.last_used_at ? timeNode(t.last_used_at) : "never"),
      el("td", { "data-testid": "token-status" }, status),
      actions,
    );
  }

  async function createToken(event) {
    event.preventDefault();
    const input = $("token-name");
    const name = input.value.trim();
    if (!name) return;
    const created = await api("POST", "v1/tokens", { name });
    input.value = "";
    $("token-secret").value = created.token;
    $("token-copy-status").textContent = "";
    show($("token-secret-box"), true);
    $("token-secret").select();
    await loadTokens();
  }

  async function copySecret() {
    const field = $("token-secret");
    field.select();
    let copied = false;
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(field.value);
        copied = true;
      } catch (e) {
        copied = false;
      }
    }
    if (!copied) copied = document.execCommand && document.execCommand("copy");
    $("token-copy-status").textContent = copied
      ? "Copied to the clipboard."
      : "Select the token and copy it by hand.";
  }

  function dismissSecret() {
    $("token-secret").value = "";
    show($("token-secret-box"), false);
  }

  // ---- journal ------------------------------------------------------------------------

  function chooseTenants() {
    const tenants = [...new Set(state.allocations.map((a) => a.tenant_id))].sort();
    const select = $("journal-tenant");
    select.replaceChildren(...tenants.map((t) => el("option", { value: t }, t)));
    show($("journal-tenant-row"), tenants.length > 1);
    if (tenants.length === 0) {
      show($("journal-empty"), true);
      setStreamStatus("no tenant", false);
      return;
    }
    const keep = tenants.includes(state.tenant) ? state.tenant : tenants[0];
    select.value = keep;
    openJournal(keep);
  }

  function setStreamStatus(text, live) {
    const badge = $("journal-status");
    badge.textContent = text;
    badge.dataset.live = live ? "true" : "false";
    badge.classList.toggle("live", live);
  }

  function closeStream() {
    if (state.stream) {
      state.stream.close();
      state.stream = null;
    }
  }

  async function openJournal(tenant) {
    closeStream();
    state.tenant = tenant;
    state.seen = new Set();
    $("journal").replaceChildren();
    show($("revert-result"), false);
    setStreamStatus("loading…", false);
    let page;
    try {
      page = await api(
        "GET",
        `v1/journal?tenant=${encodeURIComponent(tenant)}&limit=${JOURNAL_PAGE}`,
      );
    } catch (error) {
      setStreamStatus("unavailable", false);
      showError("loading the journal", error);
      return;
    }
    if (state.tenant !== tenant) return; // another tenant was chosen meanwhile
    const list = $("journal");
    for (const entry of page.entries || []) {
      if (state.seen.has(entry.seq)) continue;
      state.seen.add(entry.seq);
      list.append(journalItem(entry));
    }
    show($("journal-empty"), list.children.length === 0);
    state.lastSeq = page.last_seq || 0;
    follow(tenant, state.lastSeq);
  }

  // The live timeline: every row after `after`, newest prepended. EventSource
  // reconnects by itself and resumes with Last-Event-ID.
  function follow(tenant, after) {
    const url = `v1/journal/stream?tenant=${encodeURIComponent(tenant)}&after=${after}`;
    const stream = new EventSource(url, { withCredentials: false });
    state.stream = stream;
    setStreamStatus("connecting…", false);
    stream.addEventListener("open", () => {
      if (state.stream === stream) setStreamStatus("live", true);
    });
    stream.addEventListener("journal", (event) => {
      if (state.stream !== stream) return;
      let entry;
      try {
        entry = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (state.seen.has(entry.seq)) return;
      state.seen.add(entry.seq);
      state.lastSeq = Math.max(state.lastSeq, entry.seq);
      const list = $("journal");
      list.prepend(journalItem(entry));
      while (list.children.length > JOURNAL_KEEP) list.lastElementChild.remove();
      show($("journal-empty"), false);
      refreshUsageSoon(tenant);
    });
    // Both the server's own "error" events (with data) and connection errors.
    stream.addEventListener("error", (event) => {
      if (state.stream !== stream) return;
      if (event.data) {
        let message = event.data;
        try {
          message = JSON.parse(event.data).error || message;
        } catch (e) {
          // keep the raw text
        }
        setStreamStatus(`interrupted: ${message}`, false);
        return;
      }
      if (stream.readyState === EventSource.CLOSED) {
        // The server refused the stream: signed out (GET /me answers 401 and the
        // page says so), or the data plane is unreachable (try again later).
        setStreamStatus("disconnected; retrying shortly", false);
        window.setTimeout(async () => {
          if (state.stream !== stream) return;
          try {
            await api("GET", "me");
          } catch (error) {
            return;
          }
          if (state.stream === stream) follow(tenant, state.lastSeq);
        }, STREAM_RETRY_MS);
      } else {
        setStreamStatus("reconnecting…", false);
      }
    });
  }

  function describe(entry) {
    const parts = [];
    if (entry.old_kind || entry.new_kind) {
      const before = entry.old_kind ? `${entry.old_kind} ${humanBytes(entry.old_size)}` : "nothing";
      const after = entry.new_kind ? `${entry.new_kind} ${humanBytes(entry.new_size)}` : "nothing";
      parts.push(`${before} → ${after}`);
    }
    if (entry.old_version !== undefined || entry.new_version !== undefined) {
      parts.push(`version ${entry.old_version ?? "–"} → ${entry.new_version ?? "–"}`);
    }
    if (entry.reverts_seq !== undefined && entry.reverts_seq !== null) {
      parts.push(`reverts #${entry.reverts_seq}`);
    }
    return parts.join(" · ");
  }

  function journalItem(entry) {
    const button = el(
      "button",
      { type: "button", "data-testid": "journal-revert" },
      "Revert",
    );
    button.addEventListener("click", guarded("reverting", () => revert(entry, button)));
    const path = entry.to_path ? `${entry.path} → ${entry.to_path}` : entry.path;
    return el(
      "li",
      {
        class: "entry",
        "data-testid": "journal-entry",
        "data-seq": entry.seq,
        "data-op": entry.op,
        "data-agent": entry.agent_id,
        "data-path": entry.path,
      },
      el(
        "div",
        { class: "entry-head" },
        el("span", { class: "seq" }, `#${entry.seq}`),
        el("span", { class: "badge op" }, entry.op),
        el("code", { class: "path" }, path),
        button,
      ),
      el(
        "div",
        { class: "muted small" },
        timeNode(entry.at),
        ` · by ${entry.agent_id}`,
        describe(entry) ? ` · ${describe(entry)}` : "",
      ),
    );
  }

  async function revert(entry, button) {
    const question =
      `Restore ${entry.path} to its state just before #${entry.seq}? ` +
      "This is recorded as a new journal entry.";
    if (!window.confirm(question)) return;
    const result = $("revert-result");
    button.disabled = true;
    try {
      const answer = await api("POST", "v1/journal/revert", {
        tenant: state.tenant,
        path: entry.path,
        seq: entry.seq,
      });
      let text;
      if (answer.journal_seq == null) {
        text = `${answer.path} already was in its state before #${answer.reverted_seq}; nothing changed.`;
      } else {
        const now = answer.exists ? "restored" : "removed (it did not exist before)";
        text = `${answer.path} ${now} as of before #${answer.reverted_seq}, recorded as #${answer.journal_seq}.`;
      }
      result.textContent = text;
      result.dataset.outcome = "ok";
      result.dataset.journalSeq = answer.journal_seq == null ? "" : String(answer.journal_seq);
      result.classList.remove("error");
    } catch (error) {
      if (error instanceof SignedOut) return;
      result.textContent = `Revert of #${entry.seq} failed: ${error.message}`;
      result.dataset.outcome = "error";
      result.classList.add("error");
    } finally {
      button.disabled = false;
      show(result, true);
    }
  }

  // ---- wiring ----------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("logout").addEventListener("click", logout);
    $("error-dismiss").addEventListener("click", () => show($("error"), false));
    $("allocations-refresh").addEventListener(
      "click",
      guarded("loading allocations", loadAllocations),
    );
    $("token-form").addEventListener("submit", guarded("creating the token", createToken));
    $("token-copy").addEventListener("click", copySecret);
    $("token-secret-dismiss").addEventListener("click", dismissSecret);
    $("journal-tenant").addEventListener("change", (event) => openJournal(event.target.value));
    start();
  });
})();
