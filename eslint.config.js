// ESLint: the JavaScript and typescript-eslint recommended rules over every source file; layout is
// Prettier's (.prettierrc.json). `npm run lint` allows no warnings. Not the type-checked rule set:
// it takes minutes and over a gigabyte here, where this takes seconds.
import js from '@eslint/js'
import {defineConfig} from 'eslint/config'
import globals from 'globals'
import tseslint from 'typescript-eslint'

export default defineConfig(
  // Build output and what tools write (node_modules is ignored by default).
  {ignores: ['dist/', 'oclif.manifest.json', 'bench/results/', 'test-results/', '.tmp/']},
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    languageOptions: {ecmaVersion: 2023, sourceType: 'module', globals: globals.node},
    rules: {
      // `_name` is unused on purpose: a parameter an interface requires, a property left out of a rest.
      '@typescript-eslint/no-unused-vars': [
        'error',
        {
          argsIgnorePattern: '^_',
          varsIgnorePattern: '^_',
          caughtErrorsIgnorePattern: '^_',
          destructuredArrayIgnorePattern: '^_',
        },
      ],
    },
  },
  {
    files: ['bin/**', '**/*.cjs'],
    languageOptions: {sourceType: 'commonjs'},
    // CommonJS on purpose (bin/package.json): an ES module entry costs every start Node's ESM loader set-up.
    rules: {'@typescript-eslint/no-require-imports': 'off'},
  },
  {
    files: ['test/**'],
    // Fakes and assertions read the JSON the code under test sends; typing each wire shape would add casts, not checks.
    rules: {'@typescript-eslint/no-explicit-any': 'off'},
  },
  // The dashboard's script runs in the browser, as a classic script.
  {files: ['ui/**/*.js'], languageOptions: {sourceType: 'script', globals: globals.browser}},
)
