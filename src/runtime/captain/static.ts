import fs from 'node:fs'
import path from 'node:path'
import {APP_ROOT} from '../util/app-root.js'
import {HttpError, type Router} from '../http/router.js'

/** The dashboard's HTML, CSS and JS: plain files in the package's `ui/` folder, no build step. */
export const UI_DIR = path.join(APP_ROOT, 'ui')
export const UI_BASE = '/captain/'

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
}

/**
 * Everything comes from this origin (the gateway works without internet); the policy also keeps
 * injected markup from running script or sending data anywhere else.
 */
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
}

export function mountStaticUi(router: Router, uiDir = UI_DIR): void {
  const redirect =
    (location: string) =>
    ({res}: {res: import('node:http').ServerResponse}) => {
      res.writeHead(302, {location, 'cache-control': 'no-store'})
      res.end()
    }
  router.get('/', redirect(UI_BASE))
  router.get('/setup', redirect(`${UI_BASE}#/setup`))
  // also matches `/captain` itself (a prefix route matches its own root)
  router.get(`${UI_BASE}*`, ({res, params, url}) => {
    if (!url.pathname.endsWith('/') && !params['*']) return redirect(UI_BASE)({res})
    const relative = params['*'] || 'index.html'
    const file = path.resolve(uiDir, relative)
    const type = TYPES[path.extname(file)]
    if (!file.startsWith(uiDir + path.sep) || !type)
      throw new HttpError(404, 'E_NOT_FOUND', `no dashboard file ${relative}`)
    let body: Buffer
    try {
      body = fs.readFileSync(file)
    } catch {
      throw new HttpError(404, 'E_NOT_FOUND', `no dashboard file ${relative}`)
    }
    res.writeHead(200, {
      'content-type': type,
      'content-length': String(body.length),
      // the files change with the installed version only; no-cache still revalidates after an upgrade
      'cache-control': 'no-cache',
      ...SECURITY_HEADERS,
    })
    res.end(body)
  })
}
