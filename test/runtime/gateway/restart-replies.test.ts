import {describe, expect, it} from 'vitest'
import {startFakeDiscord} from '../../fakes/discord-server.js'
import {startFakeSlack} from '../../fakes/slack-server.js'
import {withGatewayDb} from '../../../src/runtime/state/gateway-db.js'
import {RunRecords} from '../../../src/runtime/state/run-records.js'
import type {TestHome} from '../../helpers/home.js'
import {waitFor} from '../../helpers/wait-for.js'
import {closeAfterEachTest, startTestGateway, stubRun} from './helpers.js'

/*
 * A run a crashed gateway left `running` is answered at the next start-up on the connector it
 * came from (real discord.js / Slack clients against fake platforms). MeepaChat, with a real
 * SIGKILL of `serve`, is in state-faults.test.ts.
 */

const RESTARTED = /I was restarted before I finished/
const closeAfterTest = closeAfterEachTest()

/** What a gateway killed mid-run leaves in gateway.db: a `running` row with where the message came from. */
function leftRunning(
  home: TestHome,
  run: {id: string; agentId: string; connector: string; channelId: string; threadId?: string},
): void {
  withGatewayDb(home.home, (db) =>
    new RunRecords(db).start({...run, isolation: 'unrestricted', userId: 'u1', messageId: 'm1'}),
  )
}

/** A Discord agent's gateway starting with one run a crashed gateway left in `channelId`. */
async function discordGatewayOwing(run: {id: string; channelId: string}) {
  const discord = closeAfterTest(await startFakeDiscord({token: 'MTIz.discord.token'}))
  const test = closeAfterTest(
    await startTestGateway({
      agents: [
        {
          id: 'disco',
          connectors: [{type: 'discord', bot_token: 'MTIz.discord.token', guild_ids: [], api_url: discord.apiUrl}],
        },
      ],
      run: stubRun(),
      beforeStart: (home) => leftRunning(home, {...run, agentId: 'disco', connector: 'discord'}),
    }),
  )
  return {discord, test}
}

describe('runs a crashed gateway left are answered at start-up', () => {
  it('Discord: in the channel of the message, once', async () => {
    const {discord, test} = await discordGatewayOwing({id: 'run_left1', channelId: '1001'})
    const [post] = await discord.waitForPosts(1)
    expect(post).toMatchObject({channelId: '1001'})
    expect(post?.content).toMatch(RESTARTED)
    await test.waitForLog(/run run_left1: telling discord user u1/)
    await waitFor(
      'the restart reply to be recorded as delivered',
      () => new RunRecords(test.gateway.db).get('run_left1')?.delivery === 'delivered',
    )
    const record = new RunRecords(test.gateway.db).get('run_left1')
    expect(record).toMatchObject({status: 'interrupted'})
    expect(record?.restart_reply).toMatch(/^queued /)
    expect(new RunRecords(test.gateway.db).pendingRestartReplies()).toEqual([])
    // the reply no longer waits for the session; a gateway stopped while discord.js logs in does not stop
    await test.waitForLog(/disco\/discord: connected/)
  })

  it('Discord: sent once, when the first session was lost right after it connected', async () => {
    const {discord, test} = await discordGatewayOwing({id: 'run_left5', channelId: '1002'})
    await test.waitForLog(/disco\/discord: connected \(as meepabot/)
    discord.invalidateSessions() // Discord will not resume it: discord.js identifies anew
    discord.dropConnections()
    // the outbox posts over REST, with or without a session: once, whichever session is up
    const [post] = await discord.waitForPosts(1, 10_000)
    expect(post).toMatchObject({channelId: '1002'})
    expect(post?.content).toMatch(RESTARTED)
    await discord.waitFor(() => discord.identifies === 2, 'a new session')
    await test.waitForLog(/disco\/discord: connected .*new session/)
    expect(discord.posts).toHaveLength(1)
  })

  it('Slack: in the thread of the message; a run of an agent whose connector is gone is noted, not retried forever', async () => {
    const slack = closeAfterTest(
      await startFakeSlack({botToken: 'xoxb-test-bot-token', appToken: 'xapp-1-test-app-token'}),
    )
    const test = closeAfterTest(
      await startTestGateway({
        agents: [
          {
            id: 'slacker',
            connectors: [
              {
                type: 'slack',
                bot_token: 'xoxb-test-bot-token',
                app_token: 'xapp-1-test-app-token',
                api_url: slack.apiUrl,
              },
            ],
          },
        ],
        run: stubRun(),
        beforeStart: (home) => {
          leftRunning(home, {
            id: 'run_left2',
            agentId: 'slacker',
            connector: 'slack',
            channelId: 'C100',
            threadId: '1600000000.000100',
          })
          leftRunning(home, {id: 'run_left3', agentId: 'removed-agent', connector: 'slack', channelId: 'C100'})
          leftRunning(home, {id: 'run_left4', agentId: 'slacker', connector: 'webchat', channelId: 'api-key1'})
        },
      }),
    )
    const [post] = await slack.waitForPosts(1)
    expect(post).toMatchObject({channel: 'C100', thread_ts: '1600000000.000100'})
    expect(post?.text).toMatch(RESTARTED)
    await test.waitForLog(/run run_left2: telling slack user/)
    const records = new RunRecords(test.gateway.db)
    expect(records.get('run_left3')?.restart_reply).toMatch(/^failed: agent removed-agent has no slack connector/)
    // a web chat request died with the gateway: there is nobody to tell
    expect(records.get('run_left4')).toMatchObject({status: 'interrupted', restart_reply: null})
    expect(slack.posts).toHaveLength(1)
  })
})
