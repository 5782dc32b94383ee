// For E2B's JS SDK tests against the npm package (e2b-sdk-vitest.config.mts):
// what upstream's tests/globalFetchFallback.setup.ts does by mocking the
// SDK's src/undici, here by making the undici packages fail to load. The
// package (inlined, so these mocks reach it) then falls back to the global
// fetch, late-bound, which msw patches.
import { vi } from 'vitest'

vi.mock('undici', () => {
  throw new Error('undici disabled for the tests (global fetch fallback)')
})
vi.mock('undici8', () => {
  throw new Error('undici disabled for the tests (global fetch fallback)')
})
