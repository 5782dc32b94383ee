// Preloaded into the JS SDK tests' Node processes (NODE_OPTIONS=--require)
// by scripts/e2b-sdk-tests: the wildcard DNS an operator gives
// `cordon serve --sandbox-domain`, for this machine alone. Every name under
// E2B_SDK_RESOLVE_DOMAIN resolves to 127.0.0.1, where the server listens;
// any other name resolves as before.
'use strict'
const dns = require('node:dns')

const domain = (process.env.E2B_SDK_RESOLVE_DOMAIN || '').toLowerCase()
const ours = (name) =>
  domain !== '' && typeof name === 'string' && name.toLowerCase().endsWith(`.${domain}`)

const lookup = dns.lookup
dns.lookup = function (hostname, options, callback) {
  if (typeof options === 'function') {
    callback = options
    options = {}
  }
  if (!ours(hostname)) return lookup.call(this, hostname, options, callback)
  const all = typeof options === 'object' && options !== null && options.all
  process.nextTick(() =>
    all ? callback(null, [{ address: '127.0.0.1', family: 4 }]) : callback(null, '127.0.0.1', 4)
  )
}

const promised = dns.promises.lookup
dns.promises.lookup = async function (hostname, options) {
  if (!ours(hostname)) return promised.call(this, hostname, options)
  const all = typeof options === 'object' && options !== null && options.all
  return all ? [{ address: '127.0.0.1', family: 4 }] : { address: '127.0.0.1', family: 4 }
}
