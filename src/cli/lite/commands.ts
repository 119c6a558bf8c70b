/**
 * The commands the lite bundle runs without oclif (src/cli/lite/core.ts stands in for it): the
 * ones scripts, cron and people run most, whose start-up would otherwise be mostly oclif's. Each
 * must use only what core.ts provides; test/cli/lite.test.ts runs each both ways and compares.
 */
export const LITE_COMMANDS = [
  'agent:create',
  'agent:list',
  'api-key:list',
  'audit',
  'config:check',
  'container:clean',
  'container:images',
  'container:status',
  'runs',
  'sandbox:exec',
  'sandbox:explain',
  'send',
] as const
