/* The alignment renderer of seq2seq: one sentence's source and target words, the source words shaded by the
   weights of the target word hovered (or clicked: pinned), and the whole matrix as a heatmap, for the chosen
   view (attention of a decoder layer and head or their means, or an attribution method), at word or subword
   level. It is the one renderer of every page that shows alignments: `seq2seq view` and `translate --html`
   inline this file into their self-contained page (viewer.html), `seq2seq serve` serves it to its page as
   /ui/viewer.js. It reads one sentence of the viewer's data (the format in seq2seq/alignment/viewer.py) and
   computes nothing: it only looks weights up. Every text goes in as textContent, never parsed as HTML. */
"use strict";
const AlignmentView = (() => {
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;  // text only: never parsed as HTML
    return node;
  }
  function shade(node, w) {
    node.style.backgroundColor = w === null ? "" : `rgba(33, 102, 172, ${w})`;
    node.classList.toggle("dark", w !== null && w > 0.5);
  }
  function fillSelect(select, labels, chosen, describe) {
    select.replaceChildren(...labels.map((label, i) => {
      const option = el("option", null, describe ? describe(label) : label);
      option.value = String(i);
      return option;
    }));
    select.value = String(chosen);
    select.disabled = labels.length < 2;
  }

  /* parts: the elements it fills, by name: src, tgt, matrix (required); the selectors method, layer, head,
     level and the texts sourceText, targetText, note, empty (each optional). scale: a weight w is stored as
     round(w * scale). A sentence with hard links (sentence.links, serve's page) has them outlined on hover
     and dotted in the heatmap while its attention is shown at the layer and heads they were read from. */
  class AlignmentView {
    constructor(parts, scale) {
      this.parts = parts;
      this.scale = scale;
      this.names = ["attention"];  // the views the method selector offers, in its order
      this.sentence = null;
      this.state = { view: "attention", layer: null, head: null, level: "word", pinned: null, matrix: null,
                     labels: null };
      const on = (part, handler) => {
        if (parts[part]) parts[part].addEventListener("change", (e) => handler(e.target.value));
      };
      on("method", (value) => { this.state.view = this.names[Number(value)]; this.render(); });
      on("layer", (value) => { this.state.layer = this.current().layers[Number(value)]; this.render(); });
      on("head", (value) => { this.state.head = this.current().heads[Number(value)]; this.render(); });
      on("level", (value) => { this.state.level = value; this.state.pinned = null; this.render(); });
    }

    /* The view shown (undefined where the sentence has none of that name). */
    current() {
      return this.sentence ? this.sentence.views[this.state.view] : undefined;
    }

    /* The views the method selector offers ("attention" and attribution methods); chosen: the one to show. */
    setViews(names, chosen) {
      this.names = names.length ? names.slice() : ["attention"];
      if (chosen !== undefined) this.state.view = chosen;
      if (!this.names.includes(this.state.view)) this.state.view = this.names[0];
      if (this.parts.method) fillSelect(this.parts.method, this.names, this.names.indexOf(this.state.view));
    }

    /* Show another sentence (unpinned; the view, layer, head and level chosen are kept where it has them). */
    show(sentence) {
      this.sentence = sentence;
      this.state.pinned = null;
      this.render();
    }

    render() {
      const { parts, state, sentence } = this;
      if (!sentence) return;
      if (parts.sourceText) parts.sourceText.textContent = sentence.source;
      if (parts.targetText) {
        parts.targetText.textContent = sentence.target + (sentence.confidence
          ? "  (target words underlined in red as far as the model was unsure of them; hover one for p)" : "");
      }
      const view = this.current();
      let li = 0, hi = 0;
      if (view) {  // keep the chosen layer / head where this sentence has it, else the export's choice
        li = view.layers.includes(state.layer) ? view.layers.indexOf(state.layer) : view.default[0];
        hi = view.heads.includes(state.head) ? view.heads.indexOf(state.head) : view.default[1];
      }
      if (parts.layer) fillSelect(parts.layer, view ? view.layers : ["-"], li, (l) => l === "mean" ? "mean of layers" : l);
      if (parts.head) fillSelect(parts.head, view ? view.heads : ["-"], hi, (h) => h === "mean" ? "mean of heads" : h);
      if (parts.note) parts.note.textContent = view ? view.note : "";
      if (parts.empty) parts.empty.textContent = view ? "" : `no ${state.view} matrix for this sentence`;
      state.matrix = view ? view[state.level][li][hi] : null;
      // an attribution of a re-tokenized target may have labels of its own
      const own = Boolean(view && view.levels) && JSON.stringify(view.levels) !== JSON.stringify(sentence.levels);
      const labels = own ? view.levels[state.level] : sentence.levels[state.level];
      state.labels = labels;
      // hard links were read from the export's aggregate: shown with it (the view's default layer and heads)
      const aggregate = view && li === view.default[0] && hi === view.default[1];
      state.links = !own && state.view === "attention" && sentence.links && aggregate
        ? linkSet(sentence.links[state.level]) : null;
      if (state.pinned !== null && state.pinned >= labels.tgt.length) state.pinned = null;
      parts.src.replaceChildren(...labels.src.map((word, i) => {
        const node = el("span", "tok", word);
        node.dataset.i = String(i);
        node.append(el("span", "w"));
        return node;
      }));
      const sure = sentence.confidence && !own ? sentence.confidence[state.level] : null;
      parts.tgt.replaceChildren(...labels.tgt.map((word, j) => {
        const node = el("span", "tok", word);
        node.dataset.j = String(j);
        if (sure && j < sure.log_prob.length) {  // shaded by how unsure the model was: p = exp(log p)
          const p = Math.exp(sure.log_prob[j]);
          node.style.boxShadow = `inset 0 -0.35em rgba(214, 96, 77, ${(0.8 * (1 - p)).toFixed(3)})`;
          node.dataset.p = p.toFixed(3);
          node.title = `p = ${p.toFixed(3)}, entropy ${sure.entropy[j].toFixed(2)} nats`;
        }
        node.addEventListener("mouseenter", () => this.highlight(j));
        node.addEventListener("mouseleave", () => this.highlight(state.pinned));
        node.addEventListener("click", () => this.pin(j));
        return node;
      }));
      this.renderMatrix(labels);
      this.highlight(state.pinned);
    }

    renderMatrix(labels) {
      const table = this.parts.matrix;
      const { matrix, links } = this.state;
      table.replaceChildren();
      if (!matrix || !labels.tgt.length) return;
      const head = el("tr");
      head.append(el("th"), ...labels.src.map((word) => el("th", null, word)));
      table.append(el("thead"));
      table.tHead.append(head);
      const body = el("tbody");
      matrix.forEach((row, j) => {
        const tr = el("tr");
        const th = el("th", null, labels.tgt[j]);
        th.addEventListener("click", () => this.pin(j));
        tr.append(th);
        row.forEach((value, i) => {
          const w = value / this.scale;
          const td = el("td");
          shade(td, w);
          const linked = links !== null && links.has(`${i}-${j}`);
          td.classList.toggle("link", linked);
          td.title = `${labels.tgt[j]} \u2190 ${labels.src[i]}: ${w.toFixed(3)}${linked ? " (linked)" : ""}`;
          tr.append(td);
        });
        tr.addEventListener("mouseenter", () => this.highlight(j));
        tr.addEventListener("mouseleave", () => this.highlight(this.state.pinned));
        body.append(tr);
      });
      table.append(body);
    }

    highlight(j) {
      const { parts, state } = this;
      const row = j === null || !state.matrix ? null : state.matrix[j];
      for (const node of parts.src.children) {
        const i = Number(node.dataset.i);
        const w = row ? row[i] / this.scale : null;
        node.dataset.weight = w === null ? "" : String(w);
        node.title = w === null ? "" : `weight ${w.toFixed(3)}`;
        node.querySelector(".w").textContent = w === null ? "" : w.toFixed(3);
        shade(node, w);
        node.classList.toggle("linked", j !== null && state.links !== null && state.links.has(`${i}-${j}`));
      }
      for (const node of parts.tgt.children) {
        node.classList.toggle("active", Number(node.dataset.j) === j);
        node.classList.toggle("pinned", Number(node.dataset.j) === state.pinned);
      }
      const rows = parts.matrix.tBodies[0] ? parts.matrix.tBodies[0].rows : [];
      for (let r = 0; r < rows.length; r++) rows[r].classList.toggle("active", r === j);
    }

    pin(j) {
      this.state.pinned = this.state.pinned === j ? null : j;
      this.highlight(this.state.pinned === null ? j : this.state.pinned);
    }
  }

  /* Hard links [[source i, target j], ...] as a set of "i-j". */
  function linkSet(pairs) {
    return new Set((pairs || []).map(([i, j]) => `${i}-${j}`));
  }

  AlignmentView.el = el;
  AlignmentView.fillSelect = fillSelect;
  AlignmentView.shade = shade;
  return AlignmentView;
})();
