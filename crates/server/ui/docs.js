// Renders the OpenAPI document: one expandable entry per operation, with
// its parameters, request body and responses, schemas resolved inline.
"use strict";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function resolve(doc, schema, depth) {
  if (!schema || depth > 6) return schema;
  if (schema.$ref) {
    const name = schema.$ref.split("/").pop();
    return resolve(doc, doc.components.schemas[name], depth + 1);
  }
  const out = Array.isArray(schema) ? [] : {};
  for (const [k, v] of Object.entries(schema)) {
    out[k] = v && typeof v === "object" ? resolve(doc, v, depth + 1) : v;
  }
  return out;
}

function schemaBlock(doc, title, schema) {
  return [el("h4", {}, title), el("pre", {}, JSON.stringify(resolve(doc, schema, 0), null, 2))];
}

function operation(doc, path, method, op) {
  const summary = el("summary", {},
    el("span", { class: "method " + method }, method.toUpperCase()),
    el("span", { class: "path" }, path),
    el("span", { class: "sum" }, op.summary || ""));
  const body = el("div", { class: "body" });
  if (op.description) body.append(el("p", {}, op.description));
  if (op.parameters && op.parameters.length) {
    body.append(el("h4", {}, "Parameters"));
    const ul = el("ul");
    for (const p of op.parameters) {
      ul.append(el("li", {}, el("code", {}, p.name), ` (${p.in}${p.required ? ", required" : ""}) ${p.description || ""}`));
    }
    body.append(ul);
  }
  const rb = op.requestBody && op.requestBody.content;
  if (rb) {
    for (const [type, c] of Object.entries(rb)) {
      body.append(...schemaBlock(doc, `Request body (${type})`, c.schema || {}));
    }
  }
  for (const [status, r] of Object.entries(op.responses || {})) {
    const content = r.content || {};
    const types = Object.keys(content);
    if (!types.length) {
      body.append(el("h4", {}, `${status}: ${r.description || ""}`));
      continue;
    }
    for (const t of types) {
      body.append(...schemaBlock(doc, `${status} (${t}): ${r.description || ""}`, content[t].schema || {}));
    }
  }
  return el("details", { class: "op" }, summary, body);
}

async function main() {
  const root = document.getElementById("ops");
  try {
    const doc = await (await fetch("/openapi.json")).json();
    root.textContent = "";
    if (doc.info && doc.info.description) root.append(el("p", { class: "intro" }, doc.info.description));
    const byTag = new Map();
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        const tag = (op.tags && op.tags[0]) || "other";
        if (!byTag.has(tag)) byTag.set(tag, []);
        byTag.get(tag).push(operation(doc, path, method, op));
      }
    }
    for (const [tag, ops] of byTag) {
      root.append(el("h2", {}, tag), ...ops);
    }
  } catch (e) {
    root.textContent = "Cannot load /openapi.json: " + e;
  }
}

main();
