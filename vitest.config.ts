import {defineConfig} from 'vitest/config'

export default defineConfig({
  test: {
    disableConsoleIntercept: true, // @oclif/test's runCommand needs the real console (oclif/test#655)
    env: {FORCE_COLOR: '0', NO_COLOR: '1'},
    globalSetup: ['test/global-setup.ts'],
    setupFiles: ['test/setup/unmount-volumes.ts'],
    include: ['test/**/*.test.ts'],
    reporters: ['default', './test/summary-reporter.ts'],
    testTimeout: 30_000,
    hookTimeout: 120_000,
    pool: 'forks',
  },
})
