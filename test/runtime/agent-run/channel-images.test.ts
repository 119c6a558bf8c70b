import {describe, expect, it} from 'vitest'
import {FrameError, parseAgentRunFrame} from '../../../src/runtime/agent-run/channel.js'
import {imageTypeOf} from '../../../src/runtime/shapes/image-input.js'
import {TINY_PNG} from '../../helpers/attachments.js'

const request = (images: unknown) =>
  JSON.stringify({
    type: 'llm_request',
    id: 1,
    request: {system: '', messages: [{role: 'user', content: 'look', images}], tools: []},
  })

describe('images on the LLM channel: the runner takes only real images from agent-run', () => {
  it('passes a PNG with its media type', () => {
    const frame = parseAgentRunFrame(request([{media_type: 'image/png', data: TINY_PNG.toString('base64')}]))
    expect(frame).toMatchObject({request: {messages: [{images: [{media_type: 'image/png'}]}]}})
  })

  it('refuses what is not the image its media type says, data that is not base64, and too many', () => {
    const refused = [
      [{media_type: 'image/jpeg', data: TINY_PNG.toString('base64')}],
      [{media_type: 'image/png', data: Buffer.from('#!/bin/sh\necho hi').toString('base64')}],
      [{media_type: 'image/png', data: 'not base64!'}],
      [{media_type: 'image/svg+xml', data: TINY_PNG.toString('base64')}],
      Array.from({length: 21}, () => ({media_type: 'image/png', data: TINY_PNG.toString('base64')})),
      'nope',
    ]
    for (const images of refused)
      expect(() => parseAgentRunFrame(request(images)), JSON.stringify(images).slice(0, 80)).toThrow(FrameError)
  })

  it('tells the four formats by their first bytes', () => {
    expect(imageTypeOf(TINY_PNG)).toBe('image/png')
    expect(imageTypeOf(Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0, 0, 0, 0, 0, 0, 0, 0]))).toBe('image/jpeg')
    expect(imageTypeOf(Buffer.from('GIF89a\0\0\0\0\0\0'))).toBe('image/gif')
    expect(imageTypeOf(Buffer.from('RIFF\0\0\0\0WEBPVP8 '))).toBe('image/webp')
    expect(imageTypeOf(Buffer.from('%PDF-1.7\n\0\0\0\0'))).toBeUndefined()
  })
})
