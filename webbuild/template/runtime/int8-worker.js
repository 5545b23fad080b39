// One of int8.js int8WeightsInWorkers' workers: derives each run of columns it is sent (a plan of its own and
// its bytes) and sends back the uint8 rows, transferred.

import { int8Weights } from './int8.js';

self.onmessage = ({ data }) => {
  const rows = int8Weights(data.plan, data.source);
  self.postMessage(rows, { transfer: [rows.buffer] });
};
