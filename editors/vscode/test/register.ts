/**
 * Makes `require('vscode')` resolve to the fake in fake-vscode.ts. Import this first in every test file.
 */

import Module = require('node:module');
import * as path from 'node:path';

const fakePath = path.join(__dirname, 'fake-vscode.js');
const moduleWithResolve = Module as unknown as {
    _resolveFilename(request: string, parent: unknown, isMain: boolean, options?: unknown): string;
};
const original = moduleWithResolve._resolveFilename;
moduleWithResolve._resolveFilename = function (request, parent, isMain, options) {
    if (request === 'vscode') {
        return fakePath;
    }
    return original.call(this, request, parent, isMain, options);
};
