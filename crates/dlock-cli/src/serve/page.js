// The page of `dlock serve`: polls /api/locks and redraws the table. Everything from the
// store is inserted as text (textContent), never as HTML.
"use strict";

const params = new URLSearchParams(location.search);
// How often to refresh, in ms (`?every=5000`); at least 250 ms.
const every = Math.max(250, Number(params.get("every")) || 1000);
const prefixInput = document.getElementById("prefix");
prefixInput.value = params.get("prefix") || "";

function duration(ms) {
  if (ms === null || ms === undefined) return "session";
  if (ms < 1000) return ms + "ms";
  let s = Math.floor(ms / 1000);
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= size) { parts.push(Math.floor(s / size) + unit); s %= size; }
  }
  if (s || !parts.length) parts.push(s + "s");
  return parts.join(" ");
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

async function breakLock(name) {
  if (!confirm("Break " + name + "? Its holder loses it at once.")) return;
  const token = prompt("Break token (--break-token, or in the file dlock serve named at start):");
  if (!token) return;
  const reply = await fetch("api/break", {
    method: "POST",
    headers: { "content-type": "application/json", "x-dlock-break-token": token },
    body: JSON.stringify({ name }),
  });
  const body = await reply.json().catch(() => ({}));
  alert(reply.ok ? (body.broken ? name + ": broken" : name + ": was free") : "not broken: " + (body.error || reply.status));
  refresh();
}

function draw(data) {
  document.getElementById("store").textContent = data.backend + " store " + data.store;
  const actions = data.allow_break;
  document.getElementById("actions-head").hidden = !actions;
  const body = document.getElementById("locks");
  const rows = data.locks.map((lock) => {
    const row = document.createElement("tr");
    row.dataset.name = lock.name;
    if (lock.waiters) row.className = "waited";
    cell(row, lock.name, "name");
    cell(row, lock.kind);
    cell(row, lock.label === null ? "-" : lock.label);
    cell(row, lock.host);
    cell(row, String(lock.pid), "num");
    cell(row, String(lock.fence), "num");
    cell(row, String(lock.holds), "num");
    cell(row, duration(lock.held_for_ms), "num");
    cell(row, duration(lock.ttl_left_ms), "num");
    cell(row, lock.waiters === null ? "?" : String(lock.waiters), "num waiters");
    if (actions) {
      const td = cell(row, "");
      const button = document.createElement("button");
      button.textContent = "break";
      button.addEventListener("click", () => breakLock(lock.name));
      td.appendChild(button);
    }
    return row;
  });
  body.replaceChildren(...rows);
  // The title tells the count too: a tab in the background, or a browser driven by a test
  // (the DevTools target list shows titles), sees the page's state without reading the DOM.
  document.title = "dlock: " + data.locks.length + " held" + (data.prefix ? " under " + data.prefix : "");
  const status = document.getElementById("status");
  status.className = "";
  status.textContent = data.locks.length + (data.locks.length === 1 ? " lock" : " locks") +
    " held" + (data.prefix ? " under " + data.prefix : "") + ", as of " + new Date().toLocaleTimeString() +
    (data.truncated ? " (the listing stopped at --max-locks: start dlock serve with a narrower --prefix)" : "");
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    const reply = await fetch("api/locks?prefix=" + encodeURIComponent(prefixInput.value));
    const data = await reply.json();
    if (!reply.ok) throw new Error(data.error || reply.statusText);
    draw(data);
  } catch (e) {
    const status = document.getElementById("status");
    status.className = "error";
    status.textContent = "cannot list the locks: " + e.message;
    document.title = "dlock: cannot list the locks";
  }
  timer = setTimeout(refresh, every);
}

document.getElementById("filter").addEventListener("submit", (e) => e.preventDefault());
prefixInput.addEventListener("input", () => {
  const url = new URL(location.href);
  if (prefixInput.value) url.searchParams.set("prefix", prefixInput.value);
  else url.searchParams.delete("prefix");
  history.replaceState(null, "", url);
  refresh();
});
refresh();
