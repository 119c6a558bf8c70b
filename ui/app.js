// Captain dashboard: plain JS, no build step, no third-party code. Every page uses the JSON API
// under /api/captain/; text from the server is always set as text, never parsed as HTML.
'use strict'

const API = '/api/captain'
const state = {agents: [], pollTimer: null, eventSource: null}

// The session token lives in this page's sessionStorage: per origin, so per port. Another page on
// another port of 127.0.0.1 (an agent's server, say) cannot read it, and the browser never sends
// it by itself the way it sends cookies.
const TOKEN_KEY = 'captain_token'
function sessionToken() {
  return sessionStorage.getItem(TOKEN_KEY)
}
function setSessionToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token)
  else sessionStorage.removeItem(TOKEN_KEY)
}
function authHeaders() {
  const token = sessionToken()
  return token ? {authorization: `Bearer ${token}`} : {}
}

// ---------- helpers ----------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag)
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value)
    else if (key === 'class') el.className = value
    else if (key === 'value') el.value = value
    else if (key === 'checked') el.checked = Boolean(value)
    else el.setAttribute(key, value === true ? '' : String(value))
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue
    el.append(child instanceof Node ? child : document.createTextNode(String(child)))
  }
  return el
}

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {}
    super(error.message || `request failed (${status})`)
    this.status = status
    this.code = error.code
    this.details = error.details
    this.suggestions = error.suggestions
  }
}

async function api(method, path, body) {
  const headers = {accept: 'application/json', ...authHeaders()}
  if (body !== undefined) headers['content-type'] = 'application/json'
  const res = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
  })
  const text = await res.text()
  let parsed
  try {
    parsed = text ? JSON.parse(text) : null
  } catch {
    parsed = null
  }
  if (res.status === 401 && !path.startsWith('/auth/')) {
    setSessionToken(null)
    showGate()
    throw new ApiError(res.status, parsed)
  }
  if (!res.ok) throw new ApiError(res.status, parsed)
  return parsed
}

function notice(kind, message, extra) {
  return h('div', {class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status'}, message, extra)
}

function errorNotice(error) {
  const problems = error.details && Array.isArray(error.details.problems) ? error.details.problems : null
  return notice(
    'error',
    error.message.split('\n')[0],
    problems ? h('pre', {}, problems.map((p) => `• ${p}`).join('\n')) : null,
  )
}

function badge(text, kind) {
  return h('span', {class: `badge ${kind || text}`}, text)
}

/** A table with one heading row and the given body rows. */
function dataTable(id, headings, rows) {
  return h(
    'table',
    {id},
    h('thead', {}, h('tr', {}, ...headings.map((heading) => h('th', {}, heading)))),
    h('tbody', {}, rows),
  )
}

function formatTime(ms) {
  if (!ms) return ''
  const date = new Date(ms)
  const today = new Date()
  return date.toDateString() === today.toDateString() ? date.toLocaleTimeString() : date.toLocaleString()
}

function duration(ms) {
  if (ms === null || ms === undefined) return ''
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`
}

function byteSize(bytes) {
  if (bytes === null || bytes === undefined) return ''
  if (bytes < 1024) return `${bytes} B`
  return bytes < 1024 * 1024 ? `${(bytes / 1024).toFixed(1)} KB` : `${(bytes / 1024 / 1024).toFixed(1)} MB`
}

/** A run's files (run_files): direction, name, size and type; a skipped one with its reason. */
function runFiles(files) {
  return (files || []).map((file) =>
    h(
      'div',
      {class: file.skipped_reason ? 'hint' : ''},
      `${file.direction === 'in' ? '↓' : '↑'} ${file.name}`,
      file.size !== null ? ` (${byteSize(file.size)}${file.content_type ? `, ${file.content_type}` : ''})` : '',
      file.skipped_reason ? ` not ${file.direction === 'in' ? 'taken' : 'sent'}: ${file.skipped_reason}` : '',
    ),
  )
}

/** replaceChildren that skips null/undefined/false (the DOM would print them as text). */
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined && child !== false))
}

function setMain(...children) {
  fill(document.getElementById('main'), ...children)
}

function lines(text) {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean)
}

function debounce(fn, ms) {
  let timer
  return (...args) => {
    clearTimeout(timer)
    timer = setTimeout(() => fn(...args), ms)
  }
}

// ---------- auth gate ----------

async function refreshSession() {
  const session = await api('GET', '/auth/session')
  if (!session.authenticated) setSessionToken(null)
  return session
}

/**
 * `meepagateway dashboard link` puts a one-time secret in the fragment (never sent to a server):
 * trade it for a session.
 */
async function useLoginLink() {
  const match = /^#login=([A-Za-z0-9_-]+)$/.exec(location.hash)
  if (!match) return
  history.replaceState(null, '', location.pathname)
  try {
    const result = await api('POST', '/auth/link', {secret: match[1]})
    setSessionToken(result.token)
  } catch (error) {
    state.linkError = error // shown above the login form
  }
}

/** Server-Sent Events over fetch, so the request carries the Authorization header (EventSource cannot). */
function streamEvents(url, handlers) {
  const controller = new AbortController()
  ;(async () => {
    const res = await fetch(url, {
      headers: {accept: 'text/event-stream', ...authHeaders()},
      credentials: 'omit',
      signal: controller.signal,
    })
    if (!res.ok || !res.body) throw new Error(`event stream failed (${res.status})`)
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
    let buffer = ''
    for (;;) {
      const {value, done} = await reader.read()
      if (done) break
      buffer += value
      let end
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        let event = 'message'
        const data = []
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) event = line.slice(7)
          else if (line.startsWith('data: ')) data.push(line.slice(6))
        }
        if (data.length && handlers[event]) handlers[event]({data: data.join('\n')})
      }
    }
  })().catch((error) => {
    if (!controller.signal.aborted && handlers.error) handlers.error(error)
  })
  return {close: () => controller.abort()}
}

function showGate(session) {
  document.getElementById('shell').hidden = true
  const gate = document.getElementById('gate')
  gate.hidden = false
  const setup = session ? session.setup_required : location.hash === '#/setup'
  gate.replaceChildren(setup ? setupForm() : loginForm())
  if (state.linkError) gate.prepend(errorNotice(state.linkError))
  state.linkError = null
  const first = gate.querySelector('input')
  if (first) first.focus()
}

function loginForm() {
  const message = h('div')
  const password = h('input', {
    type: 'password',
    id: 'password',
    name: 'password',
    autocomplete: 'current-password',
    required: true,
  })
  const form = h(
    'form',
    {
      class: 'card',
      id: 'login-form',
      onsubmit: async (event) => {
        event.preventDefault()
        message.replaceChildren()
        try {
          const result = await api('POST', '/auth/login', {password: password.value})
          setSessionToken(result.token)
          password.value = ''
          await enterShell()
        } catch (error) {
          message.replaceChildren(errorNotice(error))
        }
      },
    },
    h('h1', {}, '⚓ Captain'),
    h('label', {for: 'password'}, 'Dashboard password'),
    password,
    message,
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary', id: 'login'}, 'Log in')),
  )
  return form
}

function setupForm() {
  const message = h('div')
  const code = h('input', {
    type: 'text',
    id: 'setup-code',
    autocomplete: 'one-time-code',
    placeholder: 'ABC-123-XYZ',
    required: true,
  })
  const password = h('input', {
    type: 'password',
    id: 'new-password',
    autocomplete: 'new-password',
    required: true,
    minlength: 8,
  })
  const again = h('input', {type: 'password', id: 'new-password-again', autocomplete: 'new-password', required: true})
  return h(
    'form',
    {
      class: 'card',
      onsubmit: async (event) => {
        event.preventDefault()
        message.replaceChildren()
        if (password.value !== again.value) {
          message.replaceChildren(notice('error', 'The two passwords differ.'))
          return
        }
        try {
          const result = await api('POST', '/auth/setup', {code: code.value, password: password.value})
          setSessionToken(result.token)
          location.hash = '#/'
          await enterShell()
        } catch (error) {
          message.replaceChildren(errorNotice(error))
        }
      },
    },
    h('h1', {}, '⚓ First-time setup'),
    h(
      'p',
      {class: 'hint'},
      'Enter the setup code printed in the terminal running meepagateway serve, then choose the dashboard password.',
    ),
    h('label', {for: 'setup-code'}, 'Setup code'),
    code,
    h('label', {for: 'new-password'}, 'New password (8 characters or more)'),
    password,
    h('label', {for: 'new-password-again'}, 'Repeat the password'),
    again,
    message,
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary'}, 'Set password')),
  )
}

async function enterShell() {
  document.getElementById('gate').hidden = true
  document.getElementById('shell').hidden = false
  await loadAgentsNav()
  await route()
}

async function loadAgentsNav() {
  state.agents = await api('GET', '/agents')
  const group = document.getElementById('nav-agents')
  group.replaceChildren(
    h('div', {class: 'nav-title'}, 'Agents'),
    ...state.agents.map((agent) =>
      h(
        'a',
        {href: `#/agents/${encodeURIComponent(agent.id)}`, 'data-nav': `agent:${agent.id}`},
        agent.name || agent.id,
      ),
    ),
  )
}

// ---------- routing ----------

async function route() {
  if (state.pollTimer) clearInterval(state.pollTimer)
  state.pollTimer = null
  if (state.eventSource) state.eventSource.close()
  state.eventSource = null
  const hash = location.hash.replace(/^#/, '') || '/'
  let nav = 'overview'
  try {
    const agentMatch = /^\/agents\/([^/]+)$/.exec(hash)
    if (agentMatch) {
      nav = `agent:${decodeURIComponent(agentMatch[1])}`
      await agentPage(decodeURIComponent(agentMatch[1]))
    } else if (hash === '/chat') {
      nav = 'chat'
      await chatPage()
    } else if (hash === '/settings/container') {
      nav = 'container'
      await containerPage()
    } else if (hash === '/settings/access') {
      nav = 'access'
      await accessPage()
    } else {
      await overviewPage()
    }
  } catch (error) {
    if (error.status !== 401) setMain(errorNotice(error))
  }
  for (const link of document.querySelectorAll('[data-nav]')) link.classList.toggle('active', link.dataset.nav === nav)
}

// ---------- overview ----------

/** How many runs the gateway holds ready ahead of messages, and what they hold in memory. */
function standbysLine(standbys) {
  const levels = Object.entries(standbys.by_level).map(
    ([level, usage]) => `${level} ${usage.count}${usage.unmeasured ? ` (${usage.unmeasured} not measured here)` : ''}`,
  )
  return `Standbys ready: ${standbys.count} of at most ${standbys.max}${levels.length ? ` (${levels.join(', ')})` : ''}, ${(standbys.resident_bytes / 1048576).toFixed(1)} MB resident; each ends after ${standbys.idle_minutes} min without a message.`
}

/** Where container runs go: each engine's health, active runs, standbys and version (the card is hidden without one). */
function enginesView(engines) {
  if (engines.length === 0) return []
  return [
    h('h2', {}, 'Engines'),
    dataTable(
      'engines-table',
      ['Engine', 'Health', 'Active runs', 'Standbys', 'Version'],
      engines.map((engine) =>
        h(
          'tr',
          {'data-engine': engine.name},
          h('td', {class: 'mono'}, engine.name),
          h(
            'td',
            {},
            badge(engine.health),
            engine.problem ? h('div', {class: 'hint'}, `${engine.problem} (since ${engine.down_since})`) : '',
          ),
          h(
            'td',
            {},
            engine.max_runs === null ? `${engine.active_runs}` : `${engine.active_runs} of ${engine.max_runs}`,
          ),
          h('td', {}, `${engine.standbys}`),
          h('td', {class: 'mono'}, engine.version ?? '-'),
        ),
      ),
    ),
  ]
}

async function overviewPage() {
  const configNote = h('div', {id: 'config-refused'})
  const agentsCard = h('div', {class: 'card'})
  const runsCard = h('div', {class: 'card'})
  const standbysNote = h('div', {class: 'hint', id: 'standbys'})
  const enginesCard = h('div', {class: 'card', id: 'engines'})
  setMain(h('h1', {}, 'Overview'), configNote, agentsCard, standbysNote, enginesCard, runsCard)
  const refresh = async () => {
    const [file, agents, runs, health, engines] = await Promise.all([
      api('GET', '/config'),
      api('GET', '/agents'),
      api('GET', '/runs?limit=25'),
      // /healthz answers 503 with the same body when degraded
      fetch('/healthz').then(
        (res) => res.json(),
        () => ({}),
      ),
      api('GET', '/engines').catch(() => []),
    ])
    standbysNote.replaceChildren(health.standbys ? standbysLine(health.standbys) : '')
    enginesCard.replaceChildren(...enginesView(engines))
    // a hand edit the gateway refused: what runs is the previous config, and dashboard edits wait for the fix
    configNote.replaceChildren(
      file.refused
        ? notice(
            'error',
            `${file.path} has an edit the gateway refused; it still runs the previous config, and config changes here are refused until the file is fixed.`,
            h('pre', {}, file.refused),
          )
        : '',
    )
    agentsCard.replaceChildren(
      h('h2', {}, 'Agents'),
      agents.length === 0
        ? h('div', {class: 'empty'}, 'No agents are configured. Add one under agents: in config.yaml.')
        : h(
            'table',
            {id: 'agents-table'},
            h(
              'thead',
              {},
              h(
                'tr',
                {},
                h('th', {}, 'Agent'),
                h('th', {}, 'Isolation'),
                h('th', {}, 'Model'),
                h('th', {}, 'Connectors'),
              ),
            ),
            h(
              'tbody',
              {},
              agents.map((agent) =>
                h(
                  'tr',
                  {'data-agent': agent.id},
                  h(
                    'td',
                    {},
                    h('a', {href: `#/agents/${encodeURIComponent(agent.id)}`}, agent.name),
                    h('div', {class: 'hint mono'}, agent.id),
                  ),
                  h('td', {}, badge(agent.isolation)),
                  h('td', {}, h('span', {class: 'mono'}, `${agent.provider}${agent.model ? ` · ${agent.model}` : ''}`)),
                  h(
                    'td',
                    {},
                    agent.connectors.length === 0
                      ? h('span', {class: 'hint'}, 'web chat only')
                      : agent.connectors.map((c) =>
                          h('div', {title: c.problem || ''}, `${c.type} `, badge(c.state, c.state.replace(/\s/g, '-'))),
                        ),
                  ),
                ),
              ),
            ),
          ),
    )
    runsCard.replaceChildren(h('h2', {}, 'Recent runs'), runsTable(runs, true))
  }
  await refresh()
  state.pollTimer = setInterval(() => refresh().catch(() => {}), 10000)
}

/** A run's files, one line each: direction, name, size and type, or why it was skipped (never the content). */
function runsTable(runs, withAgent) {
  if (runs.length === 0) return h('div', {class: 'empty'}, 'No runs yet.')
  return h(
    'table',
    {class: 'runs'},
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', {}, 'Started'),
        withAgent && h('th', {}, 'Agent'),
        h('th', {}, 'Via'),
        h('th', {}, 'Isolation'),
        h('th', {}, 'Outcome'),
        h('th', {}, 'Reply'),
        h('th', {}, 'Time'),
        h('th', {}, 'Tools'),
        h('th', {}, 'Files'),
      ),
    ),
    h(
      'tbody',
      {},
      runs.map((run) =>
        h(
          'tr',
          {'data-run': run.id},
          h('td', {class: 'num'}, formatTime(run.started_at)),
          withAgent && h('td', {}, run.agent_id),
          h('td', {}, run.connector),
          h('td', {}, badge(run.isolation)),
          h(
            'td',
            {},
            badge(run.status),
            run.error_code ? h('div', {class: 'hint'}, `${run.error_code}: ${run.error_message || ''}`) : null,
          ),
          // chat replies go through the outbox; web chat and send answer in their response (no state)
          h(
            'td',
            {},
            run.delivery ? badge(run.delivery) : '',
            run.delivery_error ? h('div', {class: 'hint'}, run.delivery_error) : null,
          ),
          h('td', {class: 'num'}, duration(run.duration_ms)),
          h('td', {class: 'num'}, run.tool_calls ?? ''),
          h('td', {}, runFiles(run.files)),
        ),
      ),
    ),
  )
}

// ---------- agent ----------

async function agentPage(id) {
  const agent = await api('GET', `/agents/${encodeURIComponent(id)}`)
  const soul = await api('GET', `/agents/${encodeURIComponent(id)}/soul`)
  const header = h('h1', {}, agent.name, h('span', {class: 'sub mono'}, agent.id), badge(agent.isolation))

  const soulText = h('textarea', {class: 'soul', id: 'soul', spellcheck: 'false'})
  soulText.value = soul.content
  const soulMessage = h('div')
  const soulCard = h(
    'div',
    {class: 'card'},
    h('h2', {}, 'Soul (SOUL.md)'),
    h('div', {class: 'hint'}, 'The persona and standing instructions this agent reads at the start of every message.'),
    h('div', {class: 'mt-10'}, soulText),
    soulMessage,
    h(
      'div',
      {class: 'actions'},
      h(
        'button',
        {
          class: 'primary',
          id: 'save-soul',
          onclick: async () => {
            soulMessage.replaceChildren()
            try {
              const result = await api('PUT', `/agents/${encodeURIComponent(id)}/soul`, {content: soulText.value})
              soulMessage.replaceChildren(notice('ok', `Saved ${result.bytes} bytes to ${result.path}.`))
            } catch (error) {
              soulMessage.replaceChildren(errorNotice(error))
            }
          },
        },
        'Save soul',
      ),
    ),
  )

  const cm = agent.container_mode
  const fa = agent.file_access
  const f = {
    name: h('input', {type: 'text', id: 'agent-name', value: agent.name}),
    maxIterations: h('input', {type: 'number', id: 'max-iterations', min: 1, value: agent.max_iterations}),
    container: h('input', {type: 'checkbox', id: 'container-enabled', checked: cm.enabled}),
    memory: h('input', {type: 'text', id: 'memory-limit', value: cm.memory_limit}),
    timeout: h('input', {type: 'number', id: 'container-timeout', min: 1, value: cm.timeout_seconds}),
    network: h(
      'select',
      {id: 'container-network'},
      ['bridge', 'none', 'host'].map((n) => h('option', {value: n, selected: n === cm.network}, n)),
    ),
    unrestricted: h('input', {type: 'checkbox', id: 'unrestricted', checked: fa.unrestricted}),
    allowNetwork: h('input', {type: 'checkbox', id: 'allow-network', checked: fa.allow_network}),
    dotfiles: h('input', {type: 'checkbox', id: 'allow-dotfiles', checked: fa.allow_home_dotfiles}),
    allowRead: h('textarea', {id: 'allow-read', rows: 3}),
    allowWrite: h('textarea', {id: 'allow-read-write', rows: 3}),
    deny: h('textarea', {id: 'deny', rows: 3}),
  }
  f.allowRead.value = fa.allow_read.join('\n')
  f.allowWrite.value = fa.allow_read_write.join('\n')
  f.deny.value = fa.deny.join('\n')
  const unrestrictedWarning = notice(
    'danger',
    "⚠ Unrestricted: this agent runs with NO isolation. Its shell and file tools can read, change and delete anything this user can — SSH keys, cloud credentials, other agents' data, the gateway's own config. Only for agents you trust completely.",
  )
  unrestrictedWarning.id = 'unrestricted-warning'
  const syncWarning = () => {
    unrestrictedWarning.hidden = !f.unrestricted.checked
    containerFields.classList.toggle('muted', !f.container.checked)
  }
  const containerFields = h(
    'div',
    {class: 'fields3'},
    h('div', {}, h('label', {for: 'memory-limit'}, 'Memory limit'), f.memory),
    h('div', {}, h('label', {for: 'container-timeout'}, 'Timeout (s)'), f.timeout),
    h('div', {}, h('label', {for: 'container-network'}, 'Network'), f.network),
  )
  f.unrestricted.addEventListener('change', syncWarning)
  f.container.addEventListener('change', syncWarning)
  const settingsMessage = h('div')
  const settingsCard = h(
    'div',
    {class: 'card'},
    h('h2', {}, 'Isolation'),
    h('label', {for: 'agent-name'}, 'Name'),
    f.name,
    h('label', {for: 'max-iterations'}, 'Max iterations per message'),
    f.maxIterations,
    h('label', {class: 'check'}, f.container, 'Container mode — a fresh Docker container for every message'),
    containerFields,
    h('label', {class: 'check mt-16'}, f.unrestricted, 'Unrestricted file access (no sandbox)'),
    unrestrictedWarning,
    h('label', {class: 'check'}, f.allowNetwork, 'Allow network access'),
    h('label', {class: 'check'}, f.dotfiles, "Allow reading dotfiles in the operator's home"),
    h('label', {for: 'allow-read'}, 'Extra readable paths', h('div', {class: 'hint'}, 'One path per line.')),
    f.allowRead,
    h('label', {for: 'allow-read-write'}, 'Extra writable paths'),
    f.allowWrite,
    h('label', {for: 'deny'}, 'Denied paths (always win)'),
    f.deny,
    settingsMessage,
    h(
      'div',
      {class: 'actions'},
      h(
        'button',
        {
          class: 'primary',
          id: 'save-agent',
          onclick: async () => {
            settingsMessage.replaceChildren()
            try {
              const result = await api('PATCH', `/agents/${encodeURIComponent(id)}`, {
                name: f.name.value.trim() || null,
                max_iterations: Number(f.maxIterations.value),
                container_mode: {
                  enabled: f.container.checked,
                  memory_limit: f.memory.value.trim(),
                  timeout_seconds: Number(f.timeout.value),
                  network: f.network.value,
                },
                file_access: {
                  unrestricted: f.unrestricted.checked,
                  allow_network: f.allowNetwork.checked,
                  allow_home_dotfiles: f.dotfiles.checked,
                  allow_read: lines(f.allowRead.value),
                  allow_read_write: lines(f.allowWrite.value),
                  deny: lines(f.deny.value),
                },
              })
              const parts = [
                notice(
                  'ok',
                  `Saved. Isolation: ${result.agent.isolation}.${result.applied ? ' Applied to the running gateway.' : ''}`,
                ),
              ]
              for (const warning of result.warnings) parts.push(notice('danger', warning))
              if (result.restart_required.length)
                parts.push(notice('warn', `Restart the gateway to apply: ${result.restart_required.join('; ')}`))
              settingsMessage.replaceChildren(...parts)
              header.querySelector('.badge').replaceWith(badge(result.agent.isolation))
              await loadAgentsNav()
            } catch (error) {
              settingsMessage.replaceChildren(errorNotice(error))
            }
          },
        },
        'Save isolation settings',
      ),
    ),
  )
  syncWarning()

  const connectors = h(
    'div',
    {class: 'card'},
    h('h2', {}, 'Connectors'),
    agent.connectors.length === 0
      ? h('div', {class: 'empty'}, 'None: this agent is reachable through the web chat only.')
      : h(
          'table',
          {},
          h(
            'tbody',
            {},
            agent.connectors.map((c) =>
              h(
                'tr',
                {},
                h('td', {}, c.name),
                h('td', {}, c.type),
                h(
                  'td',
                  {},
                  badge(c.state, c.state.replace(/\s/g, '-')),
                  c.problem ? h('div', {class: 'hint'}, c.problem) : null,
                ),
                h('td', {class: 'mono'}, c.url || ''),
              ),
            ),
          ),
        ),
  )
  const runs = h('div', {class: 'card'}, h('h2', {}, 'Recent runs'), runsTable(agent.recent_runs, false))
  setMain(
    header,
    h('div', {class: 'grid2'}, h('div', {}, soulCard, connectors), settingsCard),
    h('div', {class: 'mt-18'}, runs),
  )
}

// ---------- container mode ----------

async function containerPage() {
  const {image_config: ic} = await api('GET', '/container/config')
  const draft = {packages: [...ic.packages], env: Object.entries(ic.env_vars)}
  let dirty = false

  const f = {
    enabled: h('input', {type: 'checkbox', id: 'image-enabled', checked: ic.enabled}),
    image: h('input', {
      type: 'text',
      id: 'prebuilt-image',
      value: ic.image,
      placeholder: 'empty = build from the settings below',
    }),
    base: h('input', {type: 'text', id: 'base-image', value: ic.base_image}),
    packageInput: h('input', {type: 'text', id: 'package-input', placeholder: 'e.g. git, python3, jq'}),
    injectCredentials: h('input', {type: 'checkbox', id: 'inject-credentials', checked: ic.inject_credentials_env}),
    injectSecrets: h('input', {type: 'checkbox', id: 'inject-secrets', checked: ic.inject_secrets_env}),
    redact: h('input', {type: 'checkbox', id: 'redact-secrets', checked: ic.redact_secrets}),
  }
  const chips = h('div', {class: 'chips', id: 'packages'})
  const envRows = h('div', {id: 'env-vars'})
  const preview = h('pre', {class: 'code', id: 'dockerfile-preview'}, 'loading…')
  const previewTag = h('div', {class: 'tag', id: 'dockerfile-tag'})
  const previewNote = h('div')
  const formMessage = h('div')
  const statusBox = h('div', {id: 'container-status'}, 'checking Docker…')
  const buildState = h('div', {id: 'build-state'})
  const buildLog = h('pre', {class: 'log', id: 'build-log', hidden: true})

  const current = () => ({
    enabled: f.enabled.checked,
    image: f.image.value.trim(),
    base_image: f.base.value.trim(),
    packages: draft.packages,
    env_vars: Object.fromEntries(draft.env.filter(([k]) => k.trim()).map(([k, v]) => [k.trim(), v])),
    inject_credentials_env: f.injectCredentials.checked,
    inject_secrets_env: f.injectSecrets.checked,
    redact_secrets: f.redact.checked,
  })

  const updatePreview = debounce(async () => {
    const value = current()
    try {
      const result = await api(
        'GET',
        `/container/dockerfile?draft=${encodeURIComponent(JSON.stringify({base_image: value.base_image, packages: value.packages, env_vars: value.env_vars}))}`,
      )
      preview.textContent = result.dockerfile
      previewTag.textContent = `tag: ${result.tag}`
      previewNote.replaceChildren(result.note ? notice('warn', result.note) : '')
    } catch (error) {
      preview.textContent = ''
      previewTag.textContent = ''
      previewNote.replaceChildren(errorNotice(error))
    }
  }, 200)
  const changed = () => {
    dirty = true
    updatePreview()
  }

  const renderChips = () =>
    chips.replaceChildren(
      ...draft.packages.map((name, index) =>
        h(
          'span',
          {class: 'chip', 'data-package': name},
          name,
          h(
            'button',
            {
              type: 'button',
              title: `remove ${name}`,
              'aria-label': `remove ${name}`,
              onclick: () => {
                draft.packages.splice(index, 1)
                renderChips()
                changed()
              },
            },
            '×',
          ),
        ),
      ),
    )
  const addPackage = () => {
    for (const name of f.packageInput.value.split(/[\s,]+/).filter(Boolean))
      if (!draft.packages.includes(name)) draft.packages.push(name)
    f.packageInput.value = ''
    renderChips()
    changed()
  }
  f.packageInput.addEventListener('keydown', (event) => {
    if (event.key === 'Enter') {
      event.preventDefault()
      addPackage()
    }
  })
  const renderEnv = () =>
    envRows.replaceChildren(
      ...draft.env.map((pair, index) => {
        const key = h('input', {
          type: 'text',
          value: pair[0],
          placeholder: 'NAME',
          class: 'env-name',
          oninput: (e) => {
            pair[0] = e.target.value
            changed()
          },
        })
        const value = h('input', {
          type: 'text',
          value: pair[1],
          placeholder: 'value',
          class: 'env-value',
          oninput: (e) => {
            pair[1] = e.target.value
            changed()
          },
        })
        return h(
          'div',
          {class: 'row mb-6'},
          key,
          value,
          h(
            'button',
            {
              type: 'button',
              class: 'danger',
              onclick: () => {
                draft.env.splice(index, 1)
                renderEnv()
                changed()
              },
            },
            'Remove',
          ),
        )
      }),
    )
  for (const input of [f.base, f.image]) input.addEventListener('input', changed)
  for (const input of [f.enabled, f.injectCredentials, f.injectSecrets, f.redact])
    input.addEventListener('change', () => {
      dirty = true
    })

  const save = async () => {
    formMessage.replaceChildren()
    const result = await api('PUT', '/container/config', current())
    dirty = false
    formMessage.replaceChildren(
      notice('ok', `Saved.${result.applied ? ' Applied to the running gateway.' : ''}`),
      ...(result.restart_required.length
        ? [notice('warn', `Restart the gateway to apply: ${result.restart_required.join('; ')}`)]
        : []),
    )
    refreshStatus().catch(() => {})
    return result
  }

  const refreshStatus = async () => {
    const status = await api('GET', '/container/status')
    if (!status.docker.ok) {
      fill(
        statusBox,
        notice('error', `Docker: ${status.docker.error.message.split('\n')[0]}`),
        ...(status.docker.error.suggestions || []).map((s) => h('div', {class: 'hint'}, `→ ${s}`)),
      )
      return status
    }
    const image = status.container_image
    fill(
      statusBox,
      h('div', {}, 'Docker engine ', badge(`running ${status.docker.version}`, 'ok')),
      image && image.tag
        ? h(
            'div',
            {class: 'mt-6'},
            'Image of the saved settings ',
            h('code', {id: 'image-tag'}, image.tag),
            ' ',
            image.exists ? badge('built', 'ok') : badge('not built', 'interrupted'),
          )
        : null,
      image && image.error ? notice('error', image.error.message) : null,
      status.images.length
        ? h(
            'table',
            {id: 'images-table', class: 'mt-10'},
            h(
              'thead',
              {},
              h(
                'tr',
                {},
                h('th', {}, 'Image'),
                h('th', {}, 'Kind'),
                h('th', {}, 'Size'),
                h('th', {}, 'Use'),
                h('th', {}, ''),
              ),
            ),
            h(
              'tbody',
              {},
              status.images
                .filter((img) => img.tag !== '<none>')
                .map((img) => {
                  const ref = `${img.repository}:${img.tag}`
                  return h(
                    'tr',
                    {'data-image': ref},
                    h('td', {class: 'mono'}, ref),
                    h('td', {}, img.kind),
                    h('td', {class: 'num'}, `${Math.round(img.size_bytes / 1e6)} MB`),
                    h(
                      'td',
                      {},
                      img.in_use
                        ? badge(img.used_by.length ? `used by ${img.used_by.join(', ')}` : 'in use', 'running')
                        : '',
                    ),
                    h('td', {}, h('button', {class: 'danger', onclick: () => deleteImage(ref)}, 'Delete')),
                  )
                }),
            ),
          )
        : h('div', {class: 'hint mt-8'}, 'No gateway images on this machine yet.'),
    )
    return status
  }

  const deleteImage = async (tag) => {
    buildState.replaceChildren()
    try {
      await api('DELETE', `/container/images/${encodeURIComponent(tag)}`)
      buildState.replaceChildren(notice('ok', `Deleted ${tag}.`))
    } catch (error) {
      buildState.replaceChildren(errorNotice(error))
    }
    await refreshStatus().catch(() => {})
  }

  const follow = (build) => {
    buildLog.hidden = false
    buildLog.textContent = ''
    buildState.replaceChildren(
      h('div', {}, 'Build ', badge('running', 'running'), ' ', h('span', {class: 'mono hint'}, build.id)),
    )
    const source = streamEvents(`${API}/container/build/${encodeURIComponent(build.id)}/events`, {
      log: (event) => {
        const {line} = JSON.parse(event.data)
        buildLog.textContent += line + '\n'
        buildLog.scrollTop = buildLog.scrollHeight
      },
      done: (event) => finished(event),
      error: (error) => buildState.replaceChildren(errorNotice(error)),
    })
    state.eventSource = source
    const finished = async (event) => {
      source.close()
      const summary = JSON.parse(event.data)
      const ok = summary.status === 'succeeded'
      fill(
        buildState,
        h(
          'div',
          {id: 'build-result', 'data-status': summary.status},
          'Build ',
          badge(summary.status),
          ok
            ? ` — ${summary.result.tag}${summary.result.built ? ` built (${summary.result.reason})` : ' was already up to date'}`
            : '',
        ),
        ok
          ? ''
          : notice(
              'error',
              summary.error.message,
              (summary.error.suggestions || []).map((s) => h('div', {class: 'hint'}, `→ ${s}`)),
            ),
      )
      for (const button of buildButtons) button.disabled = false
      await refreshStatus().catch(() => {})
    }
  }

  const startBuild = async (force) => {
    for (const button of buildButtons) button.disabled = true
    buildState.replaceChildren()
    try {
      if (dirty) await save()
      const result = await api('POST', '/container/build', {force})
      follow(result.build)
    } catch (error) {
      if (error.status === 409 && error.code === 'E_BUSY') {
        buildState.replaceChildren(notice('warn', error.message))
      } else buildState.replaceChildren(errorNotice(error))
      for (const button of buildButtons) button.disabled = false
    }
  }
  const buildButtons = [
    h('button', {class: 'primary', id: 'build', onclick: () => startBuild(false)}, 'Build'),
    h('button', {id: 'rebuild', onclick: () => startBuild(true)}, 'Rebuild'),
  ]
  const deleteCurrent = h(
    'button',
    {
      class: 'danger',
      id: 'delete-image',
      onclick: async () => {
        const status = await refreshStatus()
        const tag = status.container_image && status.container_image.tag
        if (tag) await deleteImage(tag)
      },
    },
    'Delete image',
  )

  renderChips()
  renderEnv()
  setMain(
    h('h1', {}, 'Container Mode', h('span', {class: 'sub'}, 'the image agents with container mode run in')),
    h(
      'div',
      {class: 'grid2'},
      h(
        'div',
        {class: 'card'},
        h('h2', {}, 'Image settings'),
        h('label', {class: 'check'}, f.enabled, 'Container-mode agents run in the image built from these settings'),
        h('div', {class: 'hint'}, 'Off: they run in the base image as it is.'),
        h('label', {for: 'base-image'}, 'Base image'),
        f.base,
        h('label', {for: 'package-input'}, 'Packages'),
        chips,
        h(
          'div',
          {class: 'row'},
          f.packageInput,
          h('button', {type: 'button', id: 'add-package', onclick: addPackage}, 'Add'),
        ),
        h(
          'label',
          {},
          'Environment variables',
          h('div', {class: 'hint'}, 'Baked into the image: never put secrets here.'),
        ),
        envRows,
        h(
          'button',
          {
            type: 'button',
            id: 'add-env',
            onclick: () => {
              draft.env.push(['', ''])
              renderEnv()
            },
          },
          '+ Variable',
        ),
        h(
          'label',
          {for: 'prebuilt-image'},
          'Prebuilt image instead',
          h('div', {class: 'hint'}, 'Use an image you built yourself; the settings above are then ignored.'),
        ),
        f.image,
        h(
          'label',
          {class: 'check mt-14'},
          f.injectCredentials,
          'Also put provider API keys inside containers, as environment variables',
          h(
            'div',
            {class: 'hint'},
            'Off by default: the gateway makes every LLM call, so agents never need the keys. Turning this on exposes every provider key of the agent to anything running in its container (its shell commands, the tools it installs, code it downloads), which can copy and use them.',
          ),
        ),
        h('label', {class: 'check'}, f.injectSecrets, 'Give agents their listed secrets as environment variables'),
        h('label', {class: 'check'}, f.redact, 'Redact secret values from replies, history and logs'),
        formMessage,
        h(
          'div',
          {class: 'actions'},
          h(
            'button',
            {
              class: 'primary',
              id: 'save-container',
              onclick: () => save().catch((error) => formMessage.replaceChildren(errorNotice(error))),
            },
            'Save settings',
          ),
        ),
      ),
      h(
        'div',
        {},
        h('div', {class: 'card'}, h('h2', {}, 'Dockerfile preview'), preview, previewTag, previewNote),
        h(
          'div',
          {class: 'card mt-18'},
          h('h2', {}, 'Image'),
          statusBox,
          h('div', {class: 'actions'}, ...buildButtons, deleteCurrent),
          buildState,
          buildLog,
        ),
      ),
    ),
  )
  updatePreview()
  await refreshStatus().catch((error) => fill(statusBox, errorNotice(error)))
}

// ---------- chat ----------

async function chatPage() {
  const agents = await api('GET', '/agents')
  const select = h(
    'select',
    {id: 'chat-agent'},
    agents.map((a) => h('option', {value: a.id}, `${a.name} (${a.isolation})`)),
  )
  const messages = h('div', {class: 'messages', id: 'messages'})
  const input = h('textarea', {
    id: 'chat-input',
    placeholder: 'Message the agent — Enter sends, Shift+Enter for a new line',
  })
  const sendButton = h('button', {class: 'primary', id: 'send'}, 'Send')
  // one conversation per browser tab and agent, so the agent's history stays coherent
  const channel = `captain-${Math.random().toString(36).slice(2, 10)}`

  const send = async () => {
    const text = input.value.trim()
    if (!text) return
    input.value = ''
    messages.append(h('div', {class: 'msg user'}, text))
    const pending = h(
      'div',
      {class: 'msg agent pending'},
      `${select.selectedOptions[0].textContent.split(' (')[0]} is working…`,
    )
    messages.append(pending)
    messages.scrollTop = messages.scrollHeight
    sendButton.disabled = true
    try {
      const result = await chatRequest(select.value, text, channel)
      pending.replaceWith(agentMessage(result.body, result.status))
    } catch (error) {
      pending.replaceWith(h('div', {class: 'msg agent failed'}, error.message))
    } finally {
      sendButton.disabled = false
      messages.scrollTop = messages.scrollHeight
      input.focus()
    }
  }
  sendButton.addEventListener('click', send)
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault()
      send()
    }
  })
  setMain(
    h('h1', {}, 'Chat'),
    h(
      'div',
      {class: 'card chat'},
      agents.length === 0
        ? notice('warn', 'No agents are configured.')
        : h('div', {class: 'row'}, h('label', {for: 'chat-agent', class: 'm-0'}, 'Agent'), select),
      messages,
      h('div', {class: 'composer'}, input, sendButton),
    ),
  )
  input.focus()
}

/** POST /api/chat of the web chat connector; the dashboard's session token stands in for an API key. */
async function chatRequest(agent, message, channel) {
  const res = await fetch('/api/chat', {
    method: 'POST',
    credentials: 'omit',
    headers: {'content-type': 'application/json', ...authHeaders()},
    body: JSON.stringify({agent, message, channel}),
  })
  const body = await res.json().catch(() => ({}))
  if (res.status === 401 || res.status === 403 || res.status === 400 || res.status === 404 || res.status === 415) {
    throw new Error((body.error && body.error.message) || `chat failed (${res.status})`)
  }
  return {status: res.status, body}
}

/**
 * A file the agent sent, as a download link. Always octet-stream: the agent chose the bytes and the
 * name, so the browser saves them instead of rendering them in the dashboard's origin.
 */
function sentFileLink(file) {
  const bytes = Uint8Array.from(atob(file.content_base64 || ''), (c) => c.charCodeAt(0))
  const href = URL.createObjectURL(new Blob([bytes], {type: 'application/octet-stream'}))
  return h('a', {href, download: file.name, class: 'file'}, `↓ ${file.name} (${byteSize(file.size)})`)
}

function agentMessage(body, status) {
  const failed = status !== 200
  const tools = Array.isArray(body.tool_calls) ? body.tool_calls : []
  const files = Array.isArray(body.files) ? body.files : []
  return h(
    'div',
    {class: `msg agent${failed ? ' failed' : ''}`, 'data-run': body.run_id || ''},
    body.reply || (body.error && body.error.message) || '(no reply)',
    files.length ? h('div', {class: 'files'}, files.map(sentFileLink)) : null,
    tools.length
      ? h(
          'div',
          {class: 'tools'},
          tools.map((t) =>
            h('span', {class: `tool${t.ok ? '' : ' bad'}`, title: `${t.ms} ms`}, `${t.ok ? '✓' : '✗'} ${t.name}`),
          ),
        )
      : null,
    h(
      'div',
      {class: 'meta'},
      [
        body.run_id,
        failed && body.error ? body.error.code : null,
        tools.length ? `${tools.length} tool call${tools.length === 1 ? '' : 's'}` : null,
      ]
        .filter(Boolean)
        .join(' · '),
    ),
  )
}

// ---------- API keys & password ----------

async function accessPage() {
  const session = await api('GET', '/auth/session')
  const keysCard = h('div', {class: 'card'})
  const name = h('input', {type: 'text', id: 'key-name', placeholder: 'e.g. deploy script'})
  const admin = h('input', {type: 'checkbox', id: 'key-admin'})
  const created = h('div', {id: 'created-key'})
  const renderKeys = async () => {
    const keys = await api('GET', '/auth/api-keys')
    keysCard.replaceChildren(
      h('h2', {}, 'API keys'),
      h(
        'div',
        {class: 'hint'},
        'Keys work as Authorization: Bearer. A chat key may only use POST /api/chat; an admin key may use every dashboard API route except the password.',
      ),
      keys.length === 0
        ? h('div', {class: 'empty'}, 'No keys yet.')
        : h(
            'table',
            {id: 'keys-table'},
            h(
              'thead',
              {},
              h(
                'tr',
                {},
                h('th', {}, 'Name'),
                h('th', {}, 'Kind'),
                h('th', {}, 'Key'),
                h('th', {}, 'Created'),
                h('th', {}, 'Last used'),
                h('th', {}, ''),
              ),
            ),
            h(
              'tbody',
              {},
              keys.map((key) =>
                h(
                  'tr',
                  {'data-key': key.id},
                  h('td', {}, key.name),
                  h('td', {}, key.kind === 'admin' ? badge('admin', 'warn') : 'chat'),
                  h('td', {class: 'mono'}, `${key.prefix}…`),
                  h('td', {class: 'num'}, formatTime(key.created_at)),
                  h('td', {class: 'num'}, key.last_used_at ? formatTime(key.last_used_at) : 'never'),
                  h(
                    'td',
                    {},
                    key.revoked
                      ? badge('revoked', 'failed')
                      : h(
                          'button',
                          {
                            class: 'danger',
                            onclick: async () => {
                              await api('DELETE', `/auth/api-keys/${encodeURIComponent(key.id)}`)
                              created.replaceChildren()
                              await renderKeys()
                            },
                          },
                          'Revoke',
                        ),
                  ),
                ),
              ),
            ),
          ),
      h(
        'div',
        {class: 'row mt-14'},
        name,
        h('label', {class: 'check m-0', for: 'key-admin'}, admin, 'Admin'),
        h(
          'button',
          {
            class: 'primary',
            id: 'create-key',
            onclick: async () => {
              try {
                const key = await api('POST', '/auth/api-keys', {name: name.value, admin: admin.checked})
                name.value = ''
                admin.checked = false
                created.replaceChildren(
                  notice(
                    'ok',
                    `Key "${key.name}" created. Copy it now: it is shown only once.`,
                    h('div', {class: 'secret-once', id: 'new-key'}, key.key),
                  ),
                )
                await renderKeys()
              } catch (error) {
                created.replaceChildren(errorNotice(error))
              }
            },
          },
          'Create key',
        ),
      ),
      created,
    )
  }
  const current = h('input', {type: 'password', id: 'current-password', autocomplete: 'current-password'})
  const next = h('input', {type: 'password', id: 'next-password', autocomplete: 'new-password'})
  const passwordMessage = h('div')
  const passwordCard = h(
    'div',
    {class: 'card'},
    h('h2', {}, 'Dashboard password'),
    session.password_from_env
      ? h(
          'div',
          {class: 'hint'},
          'The password comes from MEEPAGATEWAY_PASSWORD: change that variable and restart the gateway.',
        )
      : h(
          'div',
          {},
          h('label', {for: 'current-password'}, 'Current password'),
          current,
          h('label', {for: 'next-password'}, 'New password'),
          next,
          passwordMessage,
          h(
            'div',
            {class: 'actions'},
            h(
              'button',
              {
                class: 'primary',
                onclick: async () => {
                  try {
                    const result = await api('POST', '/auth/password', {
                      current_password: current.value,
                      new_password: next.value,
                    })
                    setSessionToken(result.token)
                    current.value = next.value = ''
                    passwordMessage.replaceChildren(
                      notice('ok', 'Password changed. Every other session was logged out.'),
                    )
                  } catch (error) {
                    passwordMessage.replaceChildren(errorNotice(error))
                  }
                },
              },
              'Change password',
            ),
          ),
        ),
  )
  setMain(h('h1', {}, 'API keys & password'), keysCard, passwordCard)
  await renderKeys()
}

// ---------- start ----------

document.getElementById('logout').addEventListener('click', async () => {
  await api('POST', '/auth/logout').catch(() => {})
  setSessionToken(null)
  showGate({setup_required: false})
})
window.addEventListener('hashchange', () => {
  if (!document.getElementById('shell').hidden) route()
})

;(async () => {
  try {
    await useLoginLink()
    const session = await refreshSession()
    if (session.authenticated) await enterShell()
    else showGate(session)
  } catch (error) {
    document.getElementById('gate').hidden = false
    document.getElementById('gate').replaceChildren(errorNotice(error))
  }
})()
