// The stock E2B JS SDK (from npm) against `cordon serve`: run by
// crates/server/tests/suite/e2b.rs with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL set, and E2B_NODE_MODULES naming where `e2b` is
// installed. Each check prints `ok NAME`; any failure throws.
import { createRequire } from 'node:module'
import assert from 'node:assert/strict'
import path from 'node:path'

const require = createRequire(path.join(process.env.E2B_NODE_MODULES, 'noop.js'))
const { Sandbox, CommandExitError, FilesystemEventType } = require('e2b')

const ok = (name) => console.log(`ok ${name}`)

const sbx = await Sandbox.create({ envs: { FROM_CREATE: 'yes' }, timeoutMs: 120_000 })
assert.ok(sbx.sandboxId.startsWith('sbx-'))
ok('create')

let r = await sbx.commands.run('echo hello; pwd; whoami; echo $FROM_CREATE')
assert.equal(r.stdout, 'hello\n/home/user\nuser\nyes\n')
r = await sbx.commands.run('id -u', { user: 'root' })
assert.equal(r.stdout, '0\n')
ok('run')

try {
  await sbx.commands.run('exit 3')
  assert.fail('exit 3 threw nothing')
} catch (e) {
  assert.ok(e instanceof CommandExitError, String(e))
  assert.equal(e.exitCode, 3)
}
ok('exit code')

const h = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(h.pid, 'piped\n')
await sbx.commands.closeStdin(h.pid)
r = await h.wait()
assert.equal(r.stdout, 'piped\n')
ok('stdin')

await sbx.files.write('dir/a.txt', 'from js')
assert.equal(await sbx.files.read('dir/a.txt'), 'from js')
const entries = await sbx.files.list('dir')
assert.deepEqual(entries.map((e) => e.path), ['/home/user/dir/a.txt'])
assert.equal((await sbx.files.getInfo('dir/a.txt')).size, 7)
ok('files')

const seen = []
const w = await sbx.files.watchDir('dir', (e) => seen.push([e.name, e.type]))
await sbx.files.write('dir/b.txt', 'b')
for (let i = 0; i < 50 && seen.length < 3; i++) await new Promise((res) => setTimeout(res, 100))
assert.deepEqual(seen.slice(0, 3), [
  ['b.txt', FilesystemEventType.CREATE],
  ['b.txt', FilesystemEventType.CHMOD],
  ['b.txt', FilesystemEventType.WRITE],
])
await w.stop()
ok('watch')

let out = ''
const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
await sbx.pty.resize(term.pid, { cols: 100, rows: 24 })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('tput cols; exit\n'))
await term.wait()
assert.ok(out.includes('100'), out)
ok('pty')

const listed = await Sandbox.list().nextItems()
assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
await sbx.setTimeout(60_000)
ok('list and timeout')

await sbx.files.write('/home/user/notes.txt', 'from the parent\n')
const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
assert.equal(forks.length, 2)
for (const f of forks) {
  assert.ok(!(f instanceof Error), String(f))
  assert.notEqual(f.sandboxId, sbx.sandboxId)
  assert.equal(await f.files.read('/home/user/notes.txt'), 'from the parent\n')
  await f.files.write('/home/user/mine.txt', f.sandboxId)
}
assert.equal(await sbx.files.exists('/home/user/mine.txt'), false)
for (const f of forks) await f.kill()
ok('fork')

await sbx.kill()
assert.equal(await sbx.isRunning(), false)
ok('kill')
