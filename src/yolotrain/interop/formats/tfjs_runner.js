// Runs a TF.js graph model (a yolotrain `*_web_model` folder) under Node for yolotrain's TF.js runtime
// (tfjs.py beside this file), one request at a time over stdin/stdout.
//
// Usage: node tfjs_runner.js MODEL_FOLDER, with NODE_PATH naming the node_modules folder that holds
// @tensorflow/tfjs-core, -converter, -backend-cpu and (optional, faster) -backend-wasm.
//
// Frames are little-endian. Once the model is loaded the runner writes a description: uint32 byte count, then
// JSON {"backend", "input": [dims], "outputs": [[dims] ...]}. Each request is uint32 byte count, then the NHWC
// float32 image; its answer is uint32 output count, then per output uint32 rank, rank uint32 dims and the
// float32 values. A failure ends the process with one line on stderr.

'use strict';

const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(String(message).split('\n')[0] + '\n');
  process.exit(1);
}

function requireModule(name) {
  try {
    return require(name);
  } catch (error) {
    if (error.code === 'MODULE_NOT_FOUND') {
      return null;
    }
    throw error;
  }
}

// The signature's outputs in the order yolotrain names them: output0, output1 ... output10 after output9.
function outputKeys(signature) {
  return Object.keys(signature.outputs).sort((a, b) => a.length - b.length || (a < b ? -1 : a > b ? 1 : 0));
}

function dims(tensorInfo) {
  return tensorInfo.tensorShape.dim.map((dim) => Number(dim.size));
}

async function chooseBackend(tf) {
  const wasm = requireModule('@tensorflow/tfjs-backend-wasm');
  if (wasm !== null) {
    // The .wasm binaries lie in the package's dist folder: read from there, nothing fetched.
    const dist = path.dirname(require.resolve('@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm.wasm'));
    wasm.setWasmPaths(dist + path.sep);
    if (await tf.setBackend('wasm')) {
      return 'wasm';
    }
  }
  require('@tensorflow/tfjs-backend-cpu');
  if (!(await tf.setBackend('cpu'))) {
    fail('TF.js has no CPU backend (@tensorflow/tfjs-backend-cpu is missing)');
  }
  return 'cpu';
}

async function loadModel(tf, converter, folder) {
  const modelJson = JSON.parse(fs.readFileSync(path.join(folder, 'model.json'), 'utf8'));
  if (modelJson.format !== 'graph-model' || !modelJson.modelTopology || !modelJson.signature) {
    fail(`${folder}: model.json is not a TF.js graph model with a signature`);
  }
  const artifacts = await tf.io.getModelArtifactsForJSON(modelJson, async (manifest) => {
    const specs = [];
    const buffers = [];
    for (const group of manifest) {
      specs.push(...group.weights);
      for (const shard of group.paths) {
        const file = path.resolve(folder, shard);
        if (path.dirname(file) !== path.resolve(folder)) {
          fail(`${folder}: model.json names a weights file outside its folder (${shard})`);
        }
        const bytes = fs.readFileSync(file);
        buffers.push(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
      }
    }
    return [specs, tf.io.concatenateArrayBuffers(buffers)];
  });
  const model = await converter.loadGraphModel(tf.io.fromMemory(artifacts));
  return { model, signature: modelJson.signature };
}

async function main() {
  const folder = process.argv[2];
  if (!folder) {
    fail('usage: node tfjs_runner.js MODEL_FOLDER');
  }
  const tf = requireModule('@tensorflow/tfjs-core');
  const converter = requireModule('@tensorflow/tfjs-converter');
  if (tf === null || converter === null) {
    fail('@tensorflow/tfjs-core and @tensorflow/tfjs-converter are not in NODE_PATH');
  }
  const backend = await chooseBackend(tf);
  const { model, signature } = await loadModel(tf, converter, folder);
  const inputKey = Object.keys(signature.inputs)[0];
  const inputShape = dims(signature.inputs[inputKey]);
  const keys = outputKeys(signature);
  const inputCount = inputShape.reduce((a, b) => a * b, 1);

  const description = Buffer.from(JSON.stringify({
    backend, input: inputShape, outputs: keys.map((key) => dims(signature.outputs[key])),
  }));
  const head = Buffer.alloc(4);
  head.writeUInt32LE(description.length);
  process.stdout.write(Buffer.concat([head, description]));

  function answer(image) {
    const input = tf.tensor(image, inputShape, 'float32');
    let outputs = model.execute({ [inputKey]: input }, keys);
    input.dispose();
    outputs = Array.isArray(outputs) ? outputs : [outputs];
    const parts = [];
    const count = Buffer.alloc(4);
    count.writeUInt32LE(outputs.length);
    parts.push(count);
    for (const output of outputs) {
      const shape = Buffer.alloc(4 * (1 + output.shape.length));
      shape.writeUInt32LE(output.shape.length, 0);
      output.shape.forEach((size, axis) => shape.writeUInt32LE(size, 4 * (axis + 1)));
      const values = output.dataSync();
      parts.push(shape, Buffer.from(values.buffer, values.byteOffset, values.byteLength));
      output.dispose();
    }
    return Buffer.concat(parts);
  }

  let pending = Buffer.alloc(0);
  process.stdin.on('data', (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 4) {
      const size = pending.readUInt32LE(0);
      if (pending.length < 4 + size) {
        break;
      }
      if (size !== 4 * inputCount) {
        fail(`expected an image of ${inputCount} float32 values (${inputShape.join('x')}), got ${size} bytes`);
      }
      const frame = pending.subarray(4, 4 + size);
      // A copy: Float32Array needs 4-byte alignment, which a slice of the read buffer may lack.
      const image = new Float32Array(frame.buffer.slice(frame.byteOffset, frame.byteOffset + size));
      pending = pending.subarray(4 + size);
      try {
        process.stdout.write(answer(image));
      } catch (error) {
        fail(error && error.message ? error.message : error);
      }
    }
  });
  process.stdin.on('end', () => process.exit(0));
}

main().catch((error) => fail(error && error.message ? error.message : error));
