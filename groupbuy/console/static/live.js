// Live updates of the console's pages: server-sent events from /console/live, polling
// /console/live.json when a stream cannot be held, paused while the tab is hidden.
(function () {
  "use strict";
  var root = document.querySelector("[data-live]");
  var state = document.querySelector("[data-live-state]");
  if (!root) { return; }
  var page = root.getAttribute("data-live");
  var after = root.getAttribute("data-live-after");
  var FAST_MS = 1000, SLOW_MS = 10000;
  var source = null, timer = null, pollEvery = 0;

  function say(text, on) {
    if (!state) { return; }
    state.textContent = text;
    state.classList.toggle("on", !!on);
  }

  function address(base) {
    var params = new URLSearchParams(root.getAttribute("data-live-query") || "");
    params.set("page", page);
    var id = root.getAttribute("data-live-id");
    if (id) { params.set("id", id); }
    if (after !== null) { params.set("after", after); }
    return base + "?" + params.toString();
  }

  function setFields(fields, within) {
    Object.keys(fields || {}).forEach(function (name) {
      var value = fields[name];
      var text = value === null || value === undefined ? "\u2013" : String(value);
      within.querySelectorAll('[data-field="' + CSS.escape(name) + '"]').forEach(function (el) {
        if (el.textContent !== text) { el.textContent = text; }
      });
    });
  }

  // A list page's update: each listed row's fields, by the row's id.
  function setRows(rows) {
    Object.keys(rows || {}).forEach(function (id) {
      var key = CSS.escape(id);
      root.querySelectorAll('[data-activity="' + key + '"], [data-packet="' + key + '"]')
        .forEach(function (row) { setFields(rows[id], row); });
    });
  }

  // A table of counts by key (problem codes): each key's row, added when first seen; a key
  // the update no longer carries (out of the window) shows 0.
  function setTables(tables) {
    Object.keys(tables || {}).forEach(function (name) {
      var body = root.querySelector('[data-table="' + CSS.escape(name) + '"]');
      if (!body) { return; }
      var values = tables[name] || {};
      body.querySelectorAll("[data-key]").forEach(function (row) {
        if (!(row.getAttribute("data-key") in values)) { values[row.getAttribute("data-key")] = 0; }
      });
      Object.keys(values).forEach(function (key) {
        var row = body.querySelector('[data-key="' + CSS.escape(key) + '"]');
        if (!row) {
          row = document.createElement("tr");
          row.setAttribute("data-key", key);
          var label = document.createElement("td");
          label.textContent = key;
          var cell = document.createElement("td");
          cell.setAttribute("data-field", name + "." + key);
          row.appendChild(label);
          row.appendChild(cell);
          body.appendChild(row);
        }
        var text = String(values[key]);
        var value = row.querySelector("[data-field]");
        if (value.textContent !== text) { value.textContent = text; }
      });
      var empty = root.querySelector('[data-table-empty="' + CSS.escape(name) + '"]');
      if (empty) { empty.hidden = Object.keys(values).length > 0; }
    });
  }

  function addEvents(events) {
    var body = root.querySelector("[data-events]");
    if (!body || !events) { return; }
    events.forEach(function (event) {
      if (body.querySelector('[data-event="' + event.id + '"]')) { return; }
      var row = document.createElement("tr");
      row.setAttribute("data-event", event.id);
      [event.id, event.at, event.type].forEach(function (value) {
        var cell = document.createElement("td");
        cell.textContent = String(value);
        row.appendChild(cell);
      });
      var data = document.createElement("td");
      var code = document.createElement("code");
      code.textContent = JSON.stringify(event.data);
      data.appendChild(code);
      row.appendChild(data);
      row.className = "updated";
      body.insertBefore(row, body.firstChild);
    });
  }

  function apply(update) {
    setFields(update.fields, root);
    setRows(update.rows);
    setTables(update.tables);
    addEvents(update.events);
    if (update.next_after !== undefined) { after = String(update.next_after); }
  }

  function poll() {
    timer = null;
    if (document.hidden) { return; }
    fetch(address("/console/live.json"), { credentials: "same-origin" })
      .then(function (answer) {
        if (!answer.ok) { throw new Error(String(answer.status)); }
        return answer.json();
      })
      .then(function (update) { apply(update); say("live (polling)", true); })
      .catch(function () { say("live updates paused", false); })
      .then(function () { if (!document.hidden && pollEvery) { timer = setTimeout(poll, pollEvery); } });
  }

  function startPolling(every) {
    pollEvery = every;
    if (!timer) { timer = setTimeout(poll, every); }
  }

  function stop() {
    if (source) { source.close(); source = null; }
    if (timer) { clearTimeout(timer); timer = null; }
  }

  function start() {
    stop();
    if (!window.EventSource) { startPolling(FAST_MS); return; }
    var opened = false;
    source = new EventSource(address("/console/live"));
    source.onopen = function () { opened = true; say("live", true); };
    source.onmessage = function (message) { apply(JSON.parse(message.data)); };
    source.addEventListener("end", function () {
      // The server ended this stream (its lifetime, or a restart): open a new one.
      stop();
      setTimeout(function () { if (!document.hidden) { start(); } }, FAST_MS);
    });
    source.onerror = function () {
      if (source && source.readyState === EventSource.CLOSED) {
        // Refused (over the cap, signed out): poll slowly instead; fast if it never opened.
        stop();
        startPolling(opened ? FAST_MS : SLOW_MS);
        say("live (polling)", true);
      }
    };
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); say("live updates paused", false); } else { start(); }
  });
  start();
})();
