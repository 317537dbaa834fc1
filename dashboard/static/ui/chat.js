// The chat panel (templates/ui/agent/_chat.html): send with fetch (CSRF + an Idempotency-Key made here,
// reused for every retry of the same message), read the reply with EventSource. A static file, not an
// inline script, so the Content-Security-Policy needs no 'unsafe-inline'.
//
// The reply stream ends on its own ("end", "timeout", or "interrupted" when the agent went away) and the
// browser's EventSource reconnects by itself; the page keeps the question and the partial answer until the
// committed reply replaces it. Without JavaScript the form is a normal POST and the page reloads.
(function () {
  "use strict";
  var form = document.querySelector("form[data-chat-form]");
  var log = document.querySelector("[data-chat-log]");
  if (!log) return;
  var status = form ? form.querySelector("[data-chat-status]") : null;

  function newKey() {
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return Array.prototype.map.call(bytes, function (b) { return ("0" + b.toString(16)).slice(-2); }).join("");
  }
  function say(text) { if (status) status.textContent = text; }
  function bubble(role, text) {
    var empty = log.querySelector("[data-empty]");
    if (empty) empty.remove();
    var li = document.createElement("li");
    li.className = "msg " + role;
    var who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Agent";
    var body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    li.appendChild(who);
    li.appendChild(body);
    log.appendChild(li);
    li.scrollIntoView({block: "nearest"});
    return li;
  }

  function follow(url, messageId) {
    var reply = bubble("assistant", "");
    reply.classList.add("streaming");
    reply.dataset.task = messageId;
    reply.setAttribute("data-testid", "reply-" + messageId);
    var text = reply.querySelector(".text");
    var attempt = null;
    var finished = false;
    var blockedReason = "";  // the reason code of the last "status: blocked": not every block waits for a decision
    var source = null;

    function finish(note) {
      finished = true;
      reply.classList.remove("streaming");
      if (source) source.close();
      say(note || "");
    }
    function open() {
      if (finished) return;
      source = new EventSource(url);
      source.addEventListener("queued", function () { say("Waiting for the agent…"); });
      source.addEventListener("delta", function (e) {
        var d = JSON.parse(e.data);
        if (d.attempt !== attempt) { attempt = d.attempt; text.textContent = ""; }  // a re-run starts over
        text.textContent += d.text;
        say("The agent is answering…");
      });
      source.addEventListener("reply", function (e) {
        var d = JSON.parse(e.data);
        text.textContent = d.content;
        reply.dataset.committed = "1";
        finish("");
      });
      source.addEventListener("end", function (e) {
        if (finished) return;
        var d = JSON.parse(e.data || "{}");
        finish(d.status === "blocked"
          ? "The agent's task is blocked" + (blockedReason ? " (" + blockedReason + ")" : "")
            + ": its task page says why and what clears it."
          : "The agent stopped without an answer (" + (d.status || "unknown") + ").");
      });
      source.addEventListener("status", function (e) {
        var d = JSON.parse(e.data);
        if (d.status === "blocked") {
          blockedReason = d.reason || "";
          say("The agent's task is blocked: " + (d.reason || "see its task page"));
        }
      });
      source.addEventListener("interrupted", function () { say("The agent went away mid-answer; reconnecting…"); });
      source.addEventListener("timeout", function () { say("Still waiting for the agent; reconnecting…"); });
      source.addEventListener("error", function (e) {
        if (finished) return;
        if (e.data) {  // an "error" event sent by the server: the agent refused the message
          var p = JSON.parse(e.data);
          finish("The agent refused this message: " + (p.detail || p.code || "error"));
          return;
        }
        say("Connection lost; reconnecting…");
        if (source.readyState === EventSource.CLOSED) {  // the browser gave up (e.g. an error page): try again
          setTimeout(open, 2000);
        }
      });
    }
    open();
  }

  if (log.dataset.pendingReply) follow(log.dataset.pendingReply, log.dataset.pendingId);
  if (!form) return;

  var textarea = form.querySelector("textarea[name=content]");
  var keyField = form.querySelector("input[name=idempotency_key]");
  var csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  var button = form.querySelector("button[type=submit]");
  var unsent = null;  // {content, key, bubble} of a send that has not been acknowledged yet

  function send(attempt) {
    button.disabled = true;
    say(attempt ? "Connection problem; sending again…" : "Sending…");
    var body = new URLSearchParams({content: unsent.content, idempotency_key: unsent.key});
    fetch(form.action, {method: "POST", credentials: "same-origin", body: body,
                        headers: {"Accept": "application/json", "X-CSRFToken": csrf, "Idempotency-Key": unsent.key}})
      .then(function (r) {
        if (r.status >= 500) throw new Error("server " + r.status);
        return r.json().then(function (d) { return {status: r.status, ok: r.ok, d: d}; });
      })
      .then(function (res) {
        button.disabled = false;
        var mine = unsent.bubble;
        if (!res.ok) {
          mine.classList.add("failed");
          say("Not sent: " + (res.d.detail || res.status));
          unsent = null;
          keyField.value = newKey();
          return;
        }
        unsent = null;
        textarea.value = "";
        keyField.value = newKey();
        mine.dataset.messageId = res.d.id;
        say(res.status === 202 ? "The agent is not reachable right now; your message is kept and answered when it is back." : "");
        follow(res.d.reply_url, res.d.id);
      })
      .catch(function () {
        // Not acknowledged: send the same message with the same key again (never a second message).
        if (attempt < 6) { setTimeout(function () { send(attempt + 1); }, Math.min(8000, 500 * Math.pow(2, attempt))); }
        else { button.disabled = false; say("Not sent yet: press Send to try again (it will not be sent twice)."); }
      });
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    if (unsent) { send(0); return; }  // retrying the message already shown
    var content = textarea.value;
    if (!content.trim()) return;
    unsent = {content: content, key: keyField.value || newKey(), bubble: bubble("user", content)};
    send(0);
  });
})();
