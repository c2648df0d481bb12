/* The page of seq2seq serve (seq2seq/serve/page.py): a text box whose sentences every chosen model translates
   (POST /alignments), one pane per model side by side, each drawn by the alignment renderer of the static
   viewer (AlignmentView, /ui/viewer.js); attribution on request (POST /attribution). It talks to this server
   only, sends the API key (where the server has one) as a header, never in a URL, and keeps it in memory only.
   Every text it shows goes in as textContent: nothing from a sentence or an answer is parsed as HTML. */
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const el = AlignmentView.el;
  const page = { config: null, key: "", lines: [], answers: [], sentence: 0, panes: new Map(), busy: false };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /* GET (no body) or POST JSON to this server; the answer's JSON, or an ApiError with the server's message. */
  async function api(path, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (page.key) headers["X-API-Key"] = page.key;
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST", headers, cache: "no-store", credentials: "omit",
      redirect: "error", body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, data && data.error ? data.error : `HTTP ${response.status}`);
    return data;
  }

  function showError(error) {
    const text = error instanceof ApiError ? `${error.status}: ${error.message}` : String(error.message || error);
    $("error").textContent = text;
    if (error instanceof ApiError && error.status === 401) $("key-row").hidden = false;
  }
  function setStatus(text) {
    $("status").textContent = text;
  }
  const ms = (value) => `${Math.round(value)} ms`;

  /* A translation with tags (markup): the tags as marked chips, the text between them as text. */
  function markupNodes(text) {
    return text.split(/(<[^>]*>)/).filter((part) => part).map((part) => part.startsWith("<")
      ? el("span", "tag", part) : document.createTextNode(unescapeText(part)));
  }
  function unescapeText(text) {  // the entities the markup writer escapes text with, read back as characters
    return text.replace(/&(#x[0-9a-f]+|#[0-9]+|amp|lt|gt|quot|apos|#39);/gi, (whole, name) => {
      const named = { amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'" }[name.toLowerCase()];
      if (named) return named;
      const code = name[1] === "x" || name[1] === "X" ? parseInt(name.slice(2), 16) : parseInt(name.slice(1), 10);
      return Number.isFinite(code) && code <= 0x10ffff ? String.fromCodePoint(code) : whole;
    });
  }

  /* One model's pane: its answer for the chosen sentence, drawn by the shared renderer, and its attribution. */
  class Pane {
    constructor(model) {
      this.model = model;
      this.root = $("pane-template").content.firstElementChild.cloneNode(true);
      this.root.dataset.model = model.name;
      const parts = {};
      for (const node of this.root.querySelectorAll("[data-part]")) parts[node.dataset.part] = node;
      this.view = new AlignmentView(parts, 1000);
      this.find = (cls) => this.root.querySelector(`.${cls}`);
      this.find("title").textContent = `${model.name} \u00b7 ${model.arch}`;
      const methods = model.attribution;
      this.find("explain").hidden = methods.length === 0;
      AlignmentView.fillSelect(this.find("attr-method"), methods, 0,
        (m) => `${m.method} (${m.cost}${m.slow ? "; slow" : ""})`);
      this.find("attr-method").disabled = methods.length === 0;
      this.find("attr-method").addEventListener("change", () => this.chosen(true));
      this.find("explain-button").addEventListener("click", () => this.explain());
      this.find("contrast").addEventListener("keydown", (e) => {
        if (e.key === "Enter") {
          e.preventDefault();
          this.explain();
        }
      });
      this.chosen(false);
    }

    method() {
      return this.model.attribution[Number(this.find("attr-method").value)];
    }

    /* A method was chosen: the contrast box where it has a contrastive form; a fast one runs at once. */
    chosen(run) {
      const method = this.method();
      if (!method) return;
      this.find("contrast-row").hidden = !method.contrast;
      this.find("attr-status").textContent = method.slow ? `slow: ${method.cost}; press explain` : "";
      if (run && !method.slow && this.result) this.explain();
    }

    show(answer, index, roundTrip) {
      this.answer = answer;
      this.result = answer.sentences[index];
      const result = this.result;
      this.view.scale = answer.scale;
      this.sentence = result.view || {
        index, source: result.source, target: result.translation, views: {},
        levels: { word: { src: [], tgt: [] }, subword: { src: [], tgt: [] } },
      };
      this.view.setViews(Object.keys(this.sentence.views));
      this.view.show(this.sentence);
      const marked = result.markup !== undefined && result.markup !== null && /<[^>]*>/.test(result.source);
      this.find("markup-row").hidden = !marked;
      if (marked) {
        this.find("markup-source").replaceChildren(...markupNodes(escapeLike(result.source)));
        this.find("markup-target").replaceChildren(...markupNodes(result.markup));
      }
      const nbest = this.find("nbest");
      const all = [result, ...result.alternatives];
      nbest.hidden = all.length < 2;
      nbest.replaceChildren(...(all.length < 2 ? [] : all.map((h) => {
        const item = el("li");
        if (h.markup !== undefined && h.markup !== null) item.append(...markupNodes(h.markup));
        else item.append(document.createTextNode(h.translation));
        item.append(el("span", "score", `score ${h.score.toFixed(3)}, log p ${h.log_prob.toFixed(3)}`));
        return item;
      })));
      const t = answer.timings;
      this.find("timings").textContent = `model call ${ms(t.model_ms)} (with the sentences batched with it), ` +
        `queued ${ms(t.queue_ms)}, answered after ${ms(t.total_ms)}; round trip ${ms(roundTrip)}`;
      this.find("contrast").value = result.alternatives.length ? result.alternatives[0].translation : "";
      this.chosen(false);
    }

    /* POST /attribution for the shown sentence and translation with the chosen method (and contrast). */
    async explain() {
      const method = this.method();
      const result = this.result;
      if (!method || !result) return;
      const contrast = method.contrast ? this.find("contrast").value.trim() : "";
      const name = contrast ? `${method.method} vs "${contrast}"` : method.method;
      const status = this.find("attr-status");
      if (this.sentence.views[name]) {
        this.view.setViews(Object.keys(this.sentence.views), name);
        this.view.render();
        return;
      }
      const source = this.sentence.source;  // the text translated (without its tags)
      const body = { model: this.model.name, method: method.method, source, target: result.translation };
      if (contrast) body.contrast = contrast;
      status.textContent = `computing ${name} (${method.cost})\u2026`;
      this.find("explain-button").disabled = true;
      try {
        const answer = await api("/attribution", body);
        if (this.result !== result) return;  // another sentence meanwhile
        this.sentence.views[name] = answer.view;
        this.view.setViews(Object.keys(this.sentence.views), name);
        this.view.render();
        status.textContent = `${name}: ${ms(answer.timings.model_ms)}`;
      } catch (error) {
        status.textContent = "";
        showError(error);
      } finally {
        this.find("explain-button").disabled = false;
      }
    }
  }

  /* A source as sent, for markupNodes: its text is escaped like the markup writer's output, its tags kept. */
  function escapeLike(source) {
    return source.split(/(<[^>]*>)/).map((part) => part.startsWith("<") ? part
      : part.replace(/&(?!(#x[0-9a-f]+|#[0-9]+|amp|lt|gt|quot|apos|#39);)/gi, "&amp;")).join("");
  }

  function chosenModels() {
    return [...$("models").querySelectorAll("input:checked")].map((box) => box.value);
  }

  async function translate() {
    if (page.busy) return;
    const lines = $("input").value.split("\n").map((line) => line.trim()).filter((line) => line);
    $("error").textContent = "";
    if (!lines.length) {
      setStatus("type a sentence first");
      return;
    }
    page.key = $("key").value.trim();
    if (page.config.api_key && !page.key) {
      showError(new Error("this server needs its API key: type it into the API key field"));
      $("key").focus();
      return;
    }
    const names = chosenModels();
    if (!names.length) {
      showError(new Error("choose at least one model"));
      return;
    }
    const request = { sentences: lines, beam_size: Number($("beam").value), n_best: Number($("nbest").value) };
    if ($("markup").value) request.markup = $("markup").value;
    page.busy = true;
    $("translate").disabled = true;
    setStatus(`translating with ${names.join(" and ")}\u2026`);
    const started = performance.now();
    try {
      const answers = await Promise.all(names.map((model) => api("/alignments", { ...request, model })));
      page.roundTrip = performance.now() - started;
      page.lines = lines;
      page.answers = names.map((name, k) => [name, answers[k]]);
      page.sentence = 0;
      AlignmentView.fillSelect($("sentence"), lines, 0, (line) => line.length > 80 ? line.slice(0, 80) + "\u2026" : line);
      $("sentences").hidden = lines.length < 2;
      showSentence();
      document.body.dataset.answered = String(Number(document.body.dataset.answered || 0) + 1);
      setStatus(`${lines.length === 1 ? "1 sentence" : `${lines.length} sentences`} translated by ` +
                `${names.join(" and ")}; round trip ${ms(page.roundTrip)}. Hover a target word to see its source ` +
                "words shaded; click to pin it.");
    } catch (error) {
      setStatus("");
      showError(error);
    } finally {
      page.busy = false;
      $("translate").disabled = false;
    }
  }

  function showSentence() {
    const shown = new Set();
    for (const [name, answer] of page.answers) {
      let pane = page.panes.get(name);
      if (!pane) {
        pane = new Pane(page.config.models.find((m) => m.name === name));
        page.panes.set(name, pane);
      }
      $("panes").append(pane.root);  // in the order asked
      pane.show(answer, page.sentence, page.roundTrip);
      shown.add(name);
    }
    for (const [name, pane] of page.panes) if (!shown.has(name)) pane.root.remove();
  }

  async function start() {
    try {
      page.config = await api("/models");
    } catch (error) {
      showError(error);
      return;
    }
    const config = page.config;
    $("served").textContent = config.models.map((m) => `${m.name} (${m.arch})`).join(" \u00b7 ");
    $("models").replaceChildren(...config.models.map((m) => {
      const box = el("input");
      box.type = "checkbox";
      box.value = m.name;
      box.checked = true;
      const label = el("label", null);
      label.append(box, document.createTextNode(` ${m.name}`));
      label.title = `${m.arch}: ${m.checkpoints.join(" + ")}`;
      return label;
    }));
    $("models").hidden = config.models.length < 2;
    $("beam").value = String(config.decode.beam_size);
    $("beam").max = String(config.limits.max_beam_size);
    $("nbest").value = String(config.decode.n_best);
    $("markup").value = config.markup || "";
    $("key-row").hidden = !config.api_key;
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        translate();
      }
    });
    $("translate").addEventListener("click", translate);
    $("sentence").addEventListener("change", (e) => {
      page.sentence = Number(e.target.value);
      showSentence();
    });
    document.body.dataset.ready = "true";
    $("input").focus();
  }

  start();
})();
