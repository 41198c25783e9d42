import { EgressError } from "../errors.js";
import type { BodyTap } from "../hooks/body-tap.js";
import type { DjsRun } from "./djs-phases.js";
import type { OutboundRequest } from "./exchange.js";
import type { HookedResponse, HookLimits } from "./hook-phases.js";
import type { LayerNext } from "./hook-source.js";

/** A tier-2 layer: the policy's `handle(request, next)`. */
export async function djsHandle(run: DjsRun, _request: OutboundRequest, _tap: BodyTap | undefined, _layer: LayerNext, _limits: HookLimits): Promise<HookedResponse> {
  throw new EgressError("EG_HOOK_FAILED", 502, `${run.engine.filename}: tier-2 layers are not available yet`);
}
