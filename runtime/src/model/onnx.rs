//! Export of a trained detector as an ONNX model (opset 13).
//!
//! The graph is the forward pass exactly as the engines run it: `Conv` (with `group` for the
//! depthwise layers) + `Relu`, `Add` for the residuals, `Resize` (nearest, asymmetric, floor:
//! output `(y, x)` copies input `(⌊y/2⌋, ⌊x/2⌋)`) for the neck's upsampling. Input `images`:
//! `float32 [N, 3, H, W]`, RGB scaled to `[0, 1]` (pixel / 255, as fulcrum's normalisation);
//! output `pred`: `float32 [N, K + 4, H/8, W/8]`: `K` heat-map logits, offset x/y, log width and
//! height in grid cells (decode: sigmoid, 3×3 peak, threshold; see `ops::Decode`).
//!
//! The protobuf encoding is written here by hand: the few messages used (`ModelProto`,
//! `GraphProto`, `NodeProto`, `AttributeProto`, `TensorProto`, `ValueInfoProto`) are a small,
//! stable part of `onnx.proto`, and a code generator would add a build dependency for boards.
//! Field numbers are those of onnx.proto (IR version 7).

use super::arch::Arch;

const IR_VERSION: u64 = 7;
pub const OPSET: u64 = 13;
const FLOAT: u64 = 1;

/// Protobuf wire encoding of one message.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }

    fn int(&mut self, field: u32, v: u64) -> &mut Self {
        self.key(field, 0);
        self.varint(v);
        self
    }

    fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    fn str(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }

    fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

/// An attribute: `ints` (type 7), `int` (type 2) or `string` (type 3).
enum Attr<'a> {
    Ints(&'a [i64]),
    Int(i64),
    Str(&'a str),
}

fn attribute(name: &str, a: Attr) -> Msg {
    let mut m = Msg::default();
    m.str(1, name);
    match a {
        // AttributeProto: ints = 8 (packed not required), type = 20.
        Attr::Ints(v) => {
            for &x in v {
                m.int(8, x as u64);
            }
            m.int(20, 7);
        }
        Attr::Int(v) => {
            m.int(3, v as u64).int(20, 2);
        }
        Attr::Str(s) => {
            m.str(4, s).int(20, 3);
        }
    }
    m
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Msg>) -> Msg {
    // NodeProto: input = 1, output = 2, name = 3, op_type = 4, attribute = 5.
    let mut m = Msg::default();
    for i in inputs {
        m.str(1, i);
    }
    for o in outputs {
        m.str(2, o);
    }
    m.str(3, name).str(4, op);
    for a in &attrs {
        m.msg(5, a);
    }
    m
}

fn tensor_f32(name: &str, dims: &[usize], values: &[f32]) -> Msg {
    // TensorProto: dims = 1, data_type = 2, name = 8, raw_data = 9.
    let mut m = Msg::default();
    for &d in dims {
        m.int(1, d as u64);
    }
    m.int(2, FLOAT).str(8, name);
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    m.bytes(9, &raw);
    m
}

fn tensor_f32_small(name: &str, values: &[f32]) -> Msg {
    // float_data = 4 (packed).
    let mut m = Msg::default();
    m.int(1, values.len() as u64).int(2, FLOAT).str(8, name);
    let mut packed = Msg::default();
    for &v in values {
        packed.0.extend_from_slice(&v.to_le_bytes());
    }
    m.bytes(4, &packed.0);
    m
}

fn tensor_i64(name: &str, values: &[i64]) -> Msg {
    // data_type 7 = INT64, raw_data little endian.
    let mut m = Msg::default();
    m.int(1, values.len() as u64).int(2, 7).str(8, name);
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    m.bytes(9, &raw);
    m
}

/// `ValueInfoProto` of a float tensor with named (`Err`) or fixed (`Ok`) dimensions.
fn value_info(name: &str, dims: &[Result<u64, &str>]) -> Msg {
    // TensorShapeProto.Dimension: dim_value = 1, dim_param = 2; TensorShapeProto: dim = 1;
    // TypeProto.Tensor: elem_type = 1, shape = 2; TypeProto: tensor_type = 1;
    // ValueInfoProto: name = 1, type = 2.
    let mut shape = Msg::default();
    for d in dims {
        let mut dim = Msg::default();
        match d {
            Ok(v) => dim.int(1, *v),
            Err(p) => dim.str(2, p),
        };
        shape.msg(1, &dim);
    }
    let mut tensor = Msg::default();
    tensor.int(1, FLOAT).msg(2, &shape);
    let mut ty = Msg::default();
    ty.msg(1, &tensor);
    let mut m = Msg::default();
    m.str(1, name).msg(2, &ty);
    m
}

/// Parameters that do not fit the model being exported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    #[error("{given} parameter tensors given; {model} has {needed}")]
    TensorCount {
        given: usize,
        model: String,
        needed: usize,
    },
    #[error("{name}: {given} values, the model needs {needed}")]
    TensorLength {
        name: String,
        given: usize,
        needed: usize,
    },
}

/// The ONNX model's bytes for `arch` with `params` (in [`Arch::params`] order).
pub fn export(arch: &Arch, params: &[Vec<f32>]) -> Result<Vec<u8>, ExportError> {
    let specs = arch.params();
    if params.len() != specs.len() {
        return Err(ExportError::TensorCount {
            given: params.len(),
            model: arch.config.name.clone(),
            needed: specs.len(),
        });
    }
    for (s, p) in specs.iter().zip(params) {
        if s.len() != p.len() {
            return Err(ExportError::TensorLength {
                name: s.name.clone(),
                given: p.len(),
                needed: s.len(),
            });
        }
    }
    let mut graph = Msg::default();
    let mut nodes = Vec::new();
    let mut conv_index = 0usize;
    // Adds `Conv(+Relu)` for the next weight/bias pair; returns the output name.
    let mut conv = |nodes: &mut Vec<Msg>, input: &str, stride: i64, relu: bool| -> String {
        let w = &specs[2 * conv_index];
        let name = w.name.trim_end_matches(".weight").to_owned();
        conv_index += 1;
        let (c_out, c_in_g, k) = (w.shape[0] as i64, w.shape[1] as i64, w.shape[2] as i64);
        let group = if c_in_g == 1 && name.ends_with("dw") {
            c_out
        } else {
            1
        };
        let pad = k / 2;
        let out = if relu {
            format!("{name}.conv")
        } else {
            name.clone()
        };
        nodes.push(node(
            "Conv",
            &name,
            &[input, &w.name, &format!("{name}.bias")],
            &[&out],
            vec![
                attribute("group", Attr::Int(group)),
                attribute("kernel_shape", Attr::Ints(&[k, k])),
                attribute("pads", Attr::Ints(&[pad, pad, pad, pad])),
                attribute("strides", Attr::Ints(&[stride, stride])),
            ],
        ));
        if relu {
            nodes.push(node(
                "Relu",
                &format!("{name}.relu"),
                &[&out],
                &[&name],
                vec![],
            ));
        }
        name
    };

    let resize = |nodes: &mut Vec<Msg>, input: &str, out: &str| {
        nodes.push(node(
            "Resize",
            out,
            &[input, "", "neck.up.scales"],
            &[out],
            vec![
                attribute("mode", Attr::Str("nearest")),
                attribute("coordinate_transformation_mode", Attr::Str("asymmetric")),
                attribute("nearest_mode", Attr::Str("floor")),
            ],
        ));
    };
    let mut x = conv(&mut nodes, "images", 2, true);
    let mut features = Vec::new();
    for (i, b) in arch.blocks.iter().enumerate() {
        let input = x.clone();
        let d = conv(&mut nodes, &input, b.stride as i64, true);
        let p = conv(&mut nodes, &d, 1, true);
        x = if b.residual {
            let out = format!("b{}.out", i + 1);
            nodes.push(node("Add", &out, &[&p, &input], &[&out], vec![]));
            out
        } else {
            p
        };
        features.push(x.clone());
    }
    // The neck as the graph builds it: each pointwise conv before the upsampling after it,
    // at the small size (the two commute; this order does a quarter of the work).
    let c4 = features[arch.c4_block].clone();
    let mut level_inputs = Vec::new();
    let p4 = if let Some(c5) = arch.c5_block() {
        let p5 = conv(&mut nodes, &features[c5], 1, true);
        let l4 = conv(&mut nodes, &c4, 1, true);
        resize(&mut nodes, &p5, "neck.p5.up");
        nodes.push(node(
            "Add",
            "neck.p4.out",
            &[&l4, "neck.p5.up"],
            &["neck.p4.out"],
            vec![],
        ));
        level_inputs.push("neck.p4.out".to_owned());
        level_inputs.push(p5);
        "neck.p4.out".to_owned()
    } else {
        c4
    };
    let nk = conv(&mut nodes, &p4, 1, true);
    resize(&mut nodes, &nk, "neck.up");
    nodes.push(node(
        "Add",
        "neck.out",
        &["neck.up", &features[arch.skip_block]],
        &["neck.out"],
        vec![],
    ));
    level_inputs.insert(0, "neck.out".to_owned());
    let mut outputs = Vec::new();
    for input in &level_inputs {
        let hd = conv(&mut nodes, input, 1, true);
        let hp = conv(&mut nodes, &hd, 1, true);
        outputs.push(conv(&mut nodes, &hp, 1, false));
    }
    let levels = arch.config.output_levels();
    if let [single] = &outputs[..] {
        nodes.push(node("Identity", "pred", &[single], &["pred"], vec![]));
    } else {
        // Each level flattened to [N, K+4, cells], then the levels one after another.
        let mut flat = Vec::new();
        for out in &outputs {
            let name = format!("{out}.flat");
            nodes.push(node(
                "Reshape",
                &name,
                &[out, "pred.shape"],
                &[&name],
                vec![],
            ));
            flat.push(name);
        }
        let inputs: Vec<&str> = flat.iter().map(String::as_str).collect();
        nodes.push(node(
            "Concat",
            "pred",
            &inputs,
            &["pred"],
            vec![attribute("axis", Attr::Int(2))],
        ));
    }

    // GraphProto: node = 1, name = 2, initializer = 5, input = 11, output = 12.
    for n in &nodes {
        graph.msg(1, n);
    }
    graph.str(2, &arch.config.name);
    for (s, p) in specs.iter().zip(params) {
        graph.msg(5, &tensor_f32(&s.name, &s.shape, p));
    }
    graph.msg(
        5,
        &tensor_f32_small("neck.up.scales", &[1.0, 1.0, 2.0, 2.0]),
    );
    let side = arch.config.input as u64;
    let channels = arch.config.out_channels() as u64;
    graph.msg(
        11,
        &value_info("images", &[Err("N"), Ok(3), Ok(side), Ok(side)]),
    );
    let (pred_shape, pred_doc) = if levels.len() == 1 {
        let grid = arch.config.grid() as u64;
        (
            vec![Err("N"), Ok(channels), Ok(grid), Ok(grid)],
            format!("[N,{channels},{grid},{grid}] (stride 8)"),
        )
    } else {
        graph.msg(5, &tensor_i64("pred.shape", &[0, channels as i64, -1]));
        let grids: Vec<String> = (0..levels.len())
            .map(|l| {
                let (h, w) = levels.grid(l);
                format!("{h}x{w} at stride {}", levels.stride(l))
            })
            .collect();
        (
            vec![Err("N"), Ok(channels), Ok(levels.total_cells() as u64)],
            format!(
                "[N,{channels},{}] (the cells of {}, row by row, one level after another)",
                levels.total_cells(),
                grids.join(", ")
            ),
        )
    };
    graph.msg(12, &value_info("pred", &pred_shape));

    // OperatorSetIdProto: domain = 1, version = 2. ModelProto: ir_version = 1,
    // producer_name = 2, producer_version = 3, graph = 7, opset_import = 8, doc_string = 6.
    let mut opset = Msg::default();
    opset.str(1, "").int(2, OPSET);
    let mut model = Msg::default();
    model
        .int(1, IR_VERSION)
        .str(2, "fulcrum")
        .str(3, env!("CARGO_PKG_VERSION"))
        .str(
            6,
            &format!(
                "{} for {} classes: input images float32 [N,3,{side},{side}] RGB/255; output \
                 pred {pred_doc} = heat-map logits, offset x/y, log w/h",
                arch.config.name, arch.config.classes,
            ),
        )
        .msg(7, &graph)
        .msg(8, &opset);
    Ok(model.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{init, ModelConfig};

    #[test]
    fn varints_and_fields_encode_as_protobuf() {
        let mut m = Msg::default();
        m.int(1, 300);
        assert_eq!(m.0, [0x08, 0xac, 0x02]);
        let mut m = Msg::default();
        m.str(2, "ab");
        assert_eq!(m.0, [0x12, 2, b'a', b'b']);
    }

    #[test]
    fn det_s_exports_every_parameter_and_node() {
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        let params = init::init_params(&arch, 0);
        let bytes = export(&arch, &params).unwrap();
        let raw_params: usize = params.iter().map(|p| 4 * p.len()).sum();
        assert!(bytes.len() > raw_params && bytes.len() < raw_params + 20_000);
        let text = String::from_utf8_lossy(&bytes);
        for needle in ["Conv", "Relu", "Resize", "head.out.bias", "images", "pred"] {
            assert!(text.contains(needle), "{needle}");
        }
        let e = export(&arch, &params[1..]).unwrap_err();
        assert!(matches!(e, ExportError::TensorCount { .. }), "{e}");
        assert!(e.to_string().contains("parameter tensors"), "{e}");
    }
}
