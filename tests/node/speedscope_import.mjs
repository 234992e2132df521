// Reads a speedscope file the way speedscope does, for tests/tests/profile_formats.rs.
//
// Usage: node speedscope_import.mjs <node_modules dir> <file.speedscope.json>
//
// 1. Validates the file against the schema speedscope publishes (its npm package's
//    dist/release/file-format-schema.json) with ajv.
// 2. Imports it with speedscope's own importer: the package ships only its browser bundle, so
//    the bundle runs here with the few browser globals its start-up reads, and the one statement
//    that renders the page into `document.body` is replaced by handing out its import function
//    (`importProfileGroupFromBase64`, what `speedscope <file>` calls in the browser).
// 3. Prints one JSON object: the schema errors, and per imported profile its name, unit, total
//    weight and every stack (root first, frames as name and file) with the weight speedscope
//    gives it (time spent with exactly that stack on top).
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';
import { createRequire } from 'node:module';

const [nodeModules, file] = process.argv.slice(2);
if (!nodeModules || !file) {
  throw new Error('usage: node speedscope_import.mjs <node_modules dir> <file.speedscope.json>');
}
const release = path.join(nodeModules, 'speedscope', 'dist', 'release');
const text = fs.readFileSync(file, 'utf8');

const require = createRequire(path.join(nodeModules, 'noop.js'));
const Ajv = require('ajv');
const schema = JSON.parse(fs.readFileSync(path.join(release, 'file-format-schema.json'), 'utf8'));
const validate = new Ajv({ allErrors: true }).compile(schema);
const schemaErrors = validate(JSON.parse(text)) ? [] : validate.errors;

// The render call that ends speedscope 1.25.0's bundle, and the import function it closes over.
const RENDER_CALL = 'mo(C(Os,null,C(Rf,null)),document.body,document.body.lastElementChild||void 0);';
const EXPOSE_IMPORT = 'globalThis.__speedscopeImport=Zy;';
const bundles = fs.readdirSync(release).filter((f) => /^speedscope-.*\.js$/.test(f));
if (bundles.length !== 1) {
  throw new Error(`expected one speedscope-*.js bundle in ${release}, found ${bundles}`);
}
const bundle = fs.readFileSync(path.join(release, bundles[0]), 'utf8');
if (bundle.split(RENDER_CALL).length !== 2) {
  throw new Error(`speedscope's bundle ${bundles[0]} changed: its render call is not found once`);
}
globalThis.window = globalThis;
globalThis.location = { hash: '', search: '', href: '' };
// speedscope logs what it does; stdout carries only the result.
console.log = (...args) => console.error(...args);
vm.runInThisContext(bundle.replace(RENDER_CALL, EXPOSE_IMPORT), { filename: bundles[0] });
const group = await globalThis.__speedscopeImport(
  path.basename(file),
  Buffer.from(text).toString('base64'),
);

function stacksOf(profile) {
  const stacks = new Map();
  const open = [];
  let last = 0;
  const advance = (at) => {
    if (open.length > 0 && at > last) {
      const key = JSON.stringify(open.map((f) => ({ name: f.name, file: f.file ?? null })));
      stacks.set(key, (stacks.get(key) ?? 0) + (at - last));
    }
    last = at;
  };
  profile.forEachCall(
    (node, at) => {
      advance(at);
      open.push(node.frame);
    },
    (node, at) => {
      advance(at);
      open.pop();
    },
  );
  return [...stacks].map(([key, weight]) => ({ frames: JSON.parse(key), weight }));
}

process.stdout.write(
  JSON.stringify({
    schemaErrors,
    name: group.name,
    indexToView: group.indexToView,
    profiles: group.profiles.map((profile) => ({
      name: profile.getName(),
      unit: profile.getWeightUnit(),
      totalWeight: profile.getTotalWeight(),
      stacks: stacksOf(profile),
    })),
  }),
);
