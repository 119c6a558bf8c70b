// node:tty on its own, for colour.ts to import dynamically: in a bundle a relative module loads
// lazily, where a dynamic import of a built-in stays a real import(), which the bundles'
// vm.Script cannot run.
export {isatty} from 'node:tty'
