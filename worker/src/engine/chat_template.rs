//! A model's own chat template: the Jinja source in its GGUF metadata
//! (`tokenizer.chat_template`), rendered as Hugging Face's
//! `apply_chat_template` does, so prompt token counts, the context check
//! and `prompt_tokens` are the model's own. llama.cpp's built-in matcher
//! only recognises template families and drops what a template adds on its
//! own (SmolLM2's default system message, for one).

use crate::seam::sequence::ChatMessage;
use minijinja::{Environment, ErrorKind, Value};

const NAME: &str = "chat_template";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the
    /// template may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        // transformers renders chat templates with these two on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string and dict methods (`.strip()`, `.startswith()`, `.items()`).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, source.to_owned())?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The prompt for `messages`, ending with the assistant's turn opened.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, minijinja::Error> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        self.env.get_template(NAME)?.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
    }

    /// Whether a rendered prompt already starts with the BOS text (so the
    /// tokenizer must not add a second one).
    pub fn starts_with_bos(&self, prompt: &str) -> bool {
        !self.bos_token.is_empty() && prompt.starts_with(&self.bos_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    #[test]
    fn the_model_template_adds_its_default_system_message() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            t.render(&[msg("user", "Hi")]).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&[msg("system", "Be brief."), msg("user", "Hi")])
                .unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_bos_and_raise_exception_work_as_in_transformers() {
        let source = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}\
            {{ raise_exception('tool messages are not supported') }}{% endif %}\
            [{{ m['role'].upper() }}] {{ m['content'].strip() }}\n{% endfor %}";
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        let prompt = t.render(&[msg("user", "  Hi  ")]).unwrap();
        assert_eq!(prompt, "<s>[USER] Hi\n");
        assert!(t.starts_with_bos(&prompt));
        let e = t.render(&[msg("tool", "x")]).unwrap_err();
        assert!(
            e.to_string().contains("tool messages are not supported"),
            "{e}"
        );
    }
}
