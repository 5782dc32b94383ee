// The vitest configuration scripts/e2b-sdk-tests runs E2B's JS SDK tests
// with, copied beside the tests (a packages/js-sdk of an E2B checkout,
// with node_modules from the npm package and its test dependencies).
//
// E2B_SDK_JS_MODE=npm (the default) runs the test files that can use the
// INSTALLED npm package: every `../src`, `../../src/…` import of the tests
// and their helpers resolves to the package `e2b`. A test file is left to
// E2B_SDK_JS_MODE=src, which runs it against the checkout's own src/ as
// upstream does, when it (or a helper it imports) needs what the package
// does not offer:
//   - a name imported from src/ that the package does not export (types
//     and names src/ does not have at all aside),
//   - a default, namespace or dynamic import of a module inside src/,
//   - a vi.mock of a module inside src/.
// E2B_SDK_JS_SPLIT_OUT=FILE writes which files went where, and why.
// E2B_SDK_JS_MODE=checkout runs every file against src/, as upstream does.
//
// The rest follows the upstream `unit` project (vitest.config.mts), minus
// tests/runtimes (browsers and workers) and tests/template (E2B's builder).
// Upstream's setup file reroutes the SDK's fetch through the global fetch
// (msw patches that) by mocking src/undici; against the package, which
// bundles that module, e2b-sdk-vitest.setup.ts does the same by making the
// `undici` packages fail to load, the SDK's own fallback.
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { defineConfig, type Plugin } from 'vitest/config'

const root = path.dirname(fileURLToPath(import.meta.url))
const testsDir = path.join(root, 'tests')
const srcDir = path.join(root, 'src')
const mode = ['src', 'checkout'].includes(process.env.E2B_SDK_JS_MODE ?? '')
  ? (process.env.E2B_SDK_JS_MODE as 'src' | 'checkout')
  : 'npm'
const SRC = /^(?:\.\.\/)+src(?:\/(.+?))?(?:\.js)?$/

function walk(dir: string): string[] {
  if (!fs.existsSync(dir)) return []
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name)
    return e.isDirectory() ? walk(p) : [p]
  })
}

const testFiles = walk(testsDir)
  .filter((f) => f.endsWith('.test.ts'))
  .map((f) => path.relative(root, f))
  .filter((f) => !/^tests\/(runtimes|template)\//.test(f))
  .sort()

// What the package exports, and what src/ says of a name it lacks.
const pkg: Record<string, unknown> = await import('e2b')
const srcText = walk(srcDir)
  .filter((f) => f.endsWith('.ts'))
  .map((f) => fs.readFileSync(f, 'utf8'))
  .join('\n')
// What src/index.ts exports as types only: types through `../src`.
const indexPath = path.join(srcDir, 'index.ts')
const indexTypes = new Set(
  [...(fs.existsSync(indexPath) ? fs.readFileSync(indexPath, 'utf8') : '').matchAll(
    /export\s+type\s*\{([^}]*)\}/g
  )].flatMap((m) => m[1].split(',').map((n) => n.trim().split(/\s+as\s+/).pop()!.trim()))
)
function missingFromPackage(name: string, fromIndex: boolean): boolean {
  if (name in pkg) return false
  if (fromIndex && indexTypes.has(name)) return false
  const n = name.replace(/[$]/g, '\\$')
  if (new RegExp(`export\\s+(declare\\s+)?(interface|type)\\s+${n}\\b`).test(srcText)) return false
  return new RegExp(`\\b${n}\\b`).test(srcText)
}

function resolveLocal(from: string, spec: string): string | undefined {
  const base = path.resolve(path.dirname(from), spec.replace(/\.js$/, ''))
  for (const c of [base, `${base}.ts`, `${base}.tsx`, path.join(base, 'index.ts')]) {
    if (fs.existsSync(c) && fs.statSync(c).isFile()) return c
  }
  return undefined
}

// Why a file (with the helpers it imports) needs src/, or undefined.
const seen = new Map<string, string | undefined>()
function needsSrc(file: string): string | undefined {
  if (seen.has(file)) return seen.get(file)
  seen.set(file, undefined)
  const text = fs.readFileSync(file, 'utf8')
  const rel = path.relative(root, file)
  let why: string | undefined
  const note = (w: string) => (why ??= `${rel}: ${w}`)
  for (const m of text.matchAll(/\bvi\.(?:do)?mock\(\s*['"]([^'"]+)['"]/g)) {
    if (SRC.test(m[1])) note(`mocks ${m[1]}`)
  }
  for (const m of text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) {
    const s = SRC.exec(m[1])
    if (s && s[1] && s[1] !== 'index') note(`imports ${m[1]} dynamically`)
  }
  const statics = /(?:^|\n)\s*(import|export)\s+(type\s+)?([^'";]*?)\s*from\s*['"]([^'"]+)['"]/g
  for (const m of text.matchAll(statics)) {
    const [, , typeOnly, clause, spec] = m
    if (spec.startsWith('.') && !SRC.test(spec)) {
      const local = resolveLocal(file, spec)
      if (local && local.startsWith(testsDir + path.sep)) {
        const w = needsSrc(local)
        if (w) note(`via ${w}`)
      }
      continue
    }
    const s = SRC.exec(spec)
    if (!s || typeOnly) continue
    const deep = s[1] && s[1] !== 'index'
    const named = /\{([^}]*)\}/.exec(clause)
    const outside = clause.replace(/\{[^}]*\}/, '').replace(/,/g, ' ').trim()
    if (outside && deep) note(`imports ${outside} of ${spec}`)
    for (const item of named ? named[1].split(',') : []) {
      const t = item.trim()
      if (!t || t.startsWith('type ')) continue
      const name = t.split(/\s+as\s+/)[0].trim()
      if (missingFromPackage(name, !deep)) note(`imports ${name}, which the package does not export`)
    }
  }
  seen.set(file, why)
  return why
}

const fallback = new Map<string, string>()
for (const f of testFiles) {
  const why = needsSrc(path.join(root, f))
  if (why) fallback.set(f, why)
}
if (process.env.E2B_SDK_JS_SPLIT_OUT) {
  fs.writeFileSync(
    process.env.E2B_SDK_JS_SPLIT_OUT,
    JSON.stringify(
      { npm: testFiles.filter((f) => !fallback.has(f)), src: Object.fromEntries(fallback) },
      null,
      2
    )
  )
}

// npm mode: the tests' imports of src/ are the package's.
const fromPackage: Plugin = {
  name: 'e2b-sdk-from-npm-package',
  enforce: 'pre',
  async resolveId(source, importer, options) {
    if (!importer || !SRC.test(source)) return null
    if (!importer.split('?')[0].startsWith(testsDir + path.sep)) return null
    return this.resolve('e2b', importer, { ...options, skipSelf: true })
  },
}

export default defineConfig({
  plugins: mode === 'npm' ? [fromPackage] : [],
  test: {
    name: `unit-${mode}`,
    include:
      mode === 'npm'
        ? testFiles.filter((f) => !fallback.has(f))
        : mode === 'src'
          ? testFiles.filter((f) => fallback.has(f))
          : testFiles,
    passWithNoTests: true,
    isolate: true,
    globals: false,
    testTimeout: 30_000,
    environment: 'node',
    bail: 0,
    setupFiles:
      mode === 'npm'
        ? [path.join(root, 'e2b-sdk-vitest.setup.ts')]
        : ['tests/globalFetchFallback.setup.ts'],
    server: mode === 'npm' ? { deps: { inline: ['e2b'] } } : {},
    deps: { interopDefault: true },
  },
})
